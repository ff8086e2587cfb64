"""The garbage collector while the bench works: the one place that tunes it, for runs and servers alike.

A run holds the whole trace in memory (hundreds of thousands of objects) and answers thousands of requests, each
allocating short-lived objects that reference counting frees. With CPython's default thresholds (700, 10, 10)
the collector ran ~490 young and ~4 full collections in a `run` of agentic-500, the full ones walking the trace
every time: ~0.5 s of the bench's ~3.5 s CPU. During a run the first threshold is raised to `RUN_THRESHOLD` and
everything alive once the trace is loaded (modules, the trace) is frozen out of the collector's walks (`gc.freeze`).

A server asks for more, `SERVING_THRESHOLD`, deliberately: measured under the throughput benchmark's load (64
connections), the default thresholds cost the slow path about a third of its CPU. Every request's transient objects
(an answer's logprob triples, the formatter's dicts) are alive in the requests in flight whenever a young collection
runs, so they are promoted and soon make the full collections run, each of which walked the whole loaded trace. With
the trace frozen at start and a first threshold of 50,000, a collection runs after 50,000 more container objects were
kept alive, not 700 allocated: every few thousand requests. Reference counting still frees everything acyclic at
once; only cyclic garbage waits longer.

Runs and servers overlap in one process (a run's own server, a test suite's, concurrent runs), start and stop on
their own threads and in any order. Each holds the collector (`hold`/`release`, or `tuned()`): the threshold is the
highest any holder asks for, frozen objects stay frozen while anyone holds, and when the last holder lets go the
process gets back the thresholds it had before the first, and objects unfrozen unless something had frozen them
before the bench did.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

RUN_THRESHOLD = 10_000  # allocations between young collections in a run (CPython's default: 700)
SERVING_THRESHOLD = 50_000  # while a server serves (see above)
YOUNG_THRESHOLD = RUN_THRESHOLD  # the older name

_lock = threading.Lock()
_holders: dict[int, int] = {}  # hold token -> the first threshold it asked for
_tokens = itertools.count(1)
_saved: tuple[int, int, int] | None = None  # the thresholds before the first holder
_was_frozen = False  # something froze objects before the first holder: leave them frozen at the end


def hold(young: int, *, freeze: bool = False) -> int:
    """Raise the first threshold to at least `young` until `release(token)`; `freeze`: keep what is alive now out of
    the collector's walks too. Returns the token to release."""
    global _saved, _was_frozen
    with _lock:
        if not _holders:
            _saved, _was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
        token = next(_tokens)
        _holders[token] = young
        _apply()
        if freeze:
            gc.freeze()
    return token


def release(token: int) -> None:
    """Let go of a hold; the last one out restores the collector as the first one in found it."""
    global _saved
    with _lock:
        if _holders.pop(token, None) is None:
            return
        if _holders:
            _apply()  # the remaining holders' threshold, not what was there when this one came in
            return
        if _saved is not None:
            if not _was_frozen:
                gc.unfreeze()
            gc.set_threshold(*_saved)
            _saved = None


def _apply() -> None:
    assert _saved is not None
    gc.set_threshold(max(_saved[0], *_holders.values()), *_saved[1:])


@contextmanager
def tuned(young: int = RUN_THRESHOLD) -> Iterator[None]:
    """A run's collector settings for the duration of the block (nested or concurrent runs share them)."""
    token = hold(young)
    try:
        yield
    finally:
        release(token)


@contextmanager
def loading() -> Iterator[None]:
    """No collection while the trace loads, and what it loaded frozen at once after (inside `tuned()` only).

    Everything a load allocates survives it (the store is the trace), so each young collection during the load
    walked the store built so far again, and the first one after it walked all of it: about 0.1 s of collections
    in a `run` of agentic-500. The load makes no cycles to collect; reference counting frees its temporaries."""
    if not _holders:
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
    """Keep what is alive now (the loaded trace, the modules) out of the collector's walks until the last holder
    lets go (reference counting still frees it). Only while something holds the collector, which unfreezes."""
    with _lock:
        if _holders:
            gc.freeze()
