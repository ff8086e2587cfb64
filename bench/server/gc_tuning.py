"""The garbage collector while the server serves: the loaded trace frozen, young collections rare.

Measured under the throughput benchmark's load (64 connections), the default thresholds (700, 10, 10) cost the
slow path about a third of its CPU: every request's transient objects (an answer's logprob triples, the
formatter's dicts) are alive in the 64 requests in flight whenever a young collection runs, so they are promoted
and soon make the full collections run, each of which walked the whole loaded trace. Freezing what exists once the
server starts (the trace store, the tokenizer) takes it out of every collection, and a first threshold of 50,000
means a collection runs after 50,000 more container objects were kept alive, not 700 allocated: the request log
grows by a few per request, so a collection runs every few thousand requests. Reference counting still frees
everything acyclic at once; only cyclic garbage waits longer. Servers in one process share one setting: the first
to start sets it, the last to stop restores what was there before.
"""

from __future__ import annotations

import gc
import threading

from aiohttp import web

YOUNG_THRESHOLD = 50_000

_lock = threading.Lock()  # servers start and stop on their own threads (ServerThread)
_serving = 0
_saved: tuple[int, ...] | None = None
_was_frozen = False  # something froze objects before us: leave them frozen when we restore


async def tune(app: web.Application) -> None:
    """`on_startup`: freeze what is loaded, make young collections rare (once per process)."""
    global _serving, _saved, _was_frozen
    with _lock:
        _serving += 1
        if _serving == 1:
            _saved, _was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
            gc.freeze()
            gc.set_threshold(max(_saved[0], YOUNG_THRESHOLD), *_saved[1:])


async def restore(app: web.Application) -> None:
    """`on_cleanup`: the last server to stop gives the process its thresholds back and unfreezes."""
    global _serving, _saved
    with _lock:
        _serving -= 1
        if _serving == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            if not _was_frozen:
                gc.unfreeze()
            _saved = None


def tune_while_serving(app: web.Application) -> None:
    app.on_startup.append(tune)
    app.on_cleanup.append(restore)
