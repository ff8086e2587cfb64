"""The garbage collector during a run: fewer young collections, and none that walks the loaded trace.

A run holds the whole trace in memory (hundreds of thousands of objects) and answers thousands of requests, each
allocating short-lived objects that reference counting frees. With CPython's default thresholds (700, 10, 10)
the collector ran ~490 young and ~4 full collections in a `run` of agentic-500, the full ones walking the trace
every time: ~0.5 s of the bench's ~3.5 s CPU. During a run the first threshold is raised (fewer young collections;
what survives them is what they cost, not what was freed before) and everything alive once the trace is loaded
(modules, the trace) is frozen out of the collector's walks (`gc.freeze`). Both are undone when the last run in
the process ends, so a program that runs many in one process ends each with the collector as it was.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)

_lock = threading.Lock()
_active = 0
_saved: tuple[int, int, int] | None = None
_was_frozen = False  # something froze objects before the run: leave them frozen when it ends


@contextmanager
def tuned() -> Iterator[None]:
    """The run's collector settings for the duration of the block (nested or concurrent runs share them)."""
    global _active, _saved, _was_frozen
    with _lock:
        if _active == 0:
            _saved, _was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
            gc.set_threshold(max(YOUNG_THRESHOLD, _saved[0]), *_saved[1:])
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0 and _saved is not None:
                if not _was_frozen:
                    gc.unfreeze()
                gc.set_threshold(*_saved)
                _saved = None


@contextmanager
def loading() -> Iterator[None]:
    """No collection while the trace loads, and what it loaded frozen at once after (inside `tuned()` only).

    Everything a load allocates survives it (the store is the trace), so each young collection during the load
    walked the store built so far again, and the first one after it walked all of it: about 0.1 s of collections
    in a `run` of agentic-500. The load makes no cycles to collect; reference counting frees its temporaries."""
    if not _active:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def freeze_loaded() -> None:
    """Keep what is alive now (the loaded trace, the modules) out of the collector's walks until the run ends
    (reference counting still frees it). Only inside `tuned()`, which unfreezes."""
    if _active:
        gc.freeze()
