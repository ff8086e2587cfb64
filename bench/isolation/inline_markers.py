"""The run marker of inline runs: one process-wide variable, shared by runs that overlap.

An inline (`--in-process`) target runs in the bench's own process, so its children inherit `RUN_MARKER` from
`os.environ` (`escapees`), the one environment every run in the process shares. Runs overlap (a test suite's
concurrent runs, an API user's `asyncio.gather`) and end in any order; a run that restored the value it saw at its
start would leave a finished run's marker in place, or take the marker away from a run still going, whose later
children would then escape it.

So the variable always names the set of inline runs going on: each set gets its own marker value. A child started
while runs A and B both go carries A+B's value, as either may have started it. When a run ends, the processes
marked for sets whose runs have all ended are killed: a child of A+B is not killed when A ends while B still goes
(it may be B's), and is when B ends too. With no inline run left the variable is what it was before the first."""

from __future__ import annotations

import itertools
import os
import threading

from .escapees import RUN_MARKER, kill_marked, new_marker

_lock = threading.Lock()
_runs = itertools.count(1)
_active: set[int] = set()
_values: dict[frozenset[int], str] = {}  # a set of runs that went on together -> the marker value its children carry
_outer: str | None = None  # the variable before the first inline run (a worker's own marker, or none)


def enter() -> int:
    """An inline run starts: its children (and any other run's still going) carry a marker for all of them."""
    global _outer
    with _lock:
        if not _active:
            _outer = os.environ.get(RUN_MARKER)
        run = next(_runs)
        _active.add(run)
        os.environ[RUN_MARKER] = _values.setdefault(frozenset(_active), new_marker())
        return run


def leave(run: int) -> list[int]:
    """An inline run ended: the variable names the runs still going (or is back as before the first), and every
    process marked for runs that have all ended is killed; the pids killed."""
    with _lock:
        _active.discard(run)
        if _active:
            os.environ[RUN_MARKER] = _values.setdefault(frozenset(_active), new_marker())
        elif _outer is None:
            os.environ.pop(RUN_MARKER, None)
        else:
            os.environ[RUN_MARKER] = _outer
        ended = [runs for runs in _values if not runs & _active]
        finished = [_values.pop(runs) for runs in ended]
    killed: list[int] = []
    for value in finished:
        killed += kill_marked(RUN_MARKER, value)
    return killed


def current(run: int) -> str | None:
    """The marker value the run's children would carry now (for tests and diagnostics)."""
    with _lock:
        return os.environ.get(RUN_MARKER) if run in _active else None
