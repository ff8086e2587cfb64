"""Processes that left the worker's process group (`setsid`, a daemonising library) still end with the run.

A process group kill reaches only the group. A target's child that calls `setsid` (Ray's raylet, a
daemon, `start_new_session=True`) moves to a session of its own and survives it. Every process a run
starts carries a marker in its environment (`ROLLOUT_BENCH_RUN_MARKER`, one random value per run),
inherited by every descendant however it detaches; at the end of the run the harness, and a worker
whose harness is gone, SIGKILL every process whose `/proc/PID/environ` holds it. A sweep marks its runs
the same way under its own variable. What this cannot catch: a process that clears its environment
before it execs (`env -i`), and platforms without `/proc` (there, the group kill is all there is).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from .proc_stat import read_stat

RUN_MARKER = "ROLLOUT_BENCH_RUN_MARKER"  # set in a worker's environment: its run
SWEEP_MARKER = "ROLLOUT_BENCH_SWEEP_MARKER"  # set in a sweep's runs' environment: the sweep


def new_marker() -> str:
    return uuid.uuid4().hex


def marked(variable: str, value: str) -> list[int]:
    """The pids (not this process) whose environment holds `variable=value`."""
    needle = f"{variable}={value}".encode()
    own, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == own:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found


def kill_marked(variable: str, value: str | None, passes: int = 5) -> list[int]:
    """SIGKILL every process marked `variable=value`, again until none is left (one may fork meanwhile);
    the pids killed. Nothing happens without a value (an unmarked run) or without /proc."""
    if not value or not os.path.isdir("/proc"):
        return []
    killed: list[int] = []
    for _ in range(passes):
        pids = [pid for pid in marked(variable, value) if pid not in killed]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = read_stat(entry.name)
        if stat is not None:  # else ended meanwhile
            children.setdefault(stat.ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
