"""Which Ray processes on this machine belong to a given run: the bench starts Ray in the run's worker with a
session folder `/tmp/rb-ray-<worker pid>-*`, which Ray's daemons name on their command line and its workers
(`ray::IDLE`, actors, whose command line is only their title) keep open as their log files."""

from __future__ import annotations

import os
import re

import psutil

_SESSION = re.compile(r"/tmp/rb-ray-(\d+)-")


def _session_owner(process: psutil.Process, cmdline: str) -> int | None:
    found = _SESSION.search(cmdline)
    if found is None:
        try:
            links = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
        except OSError:
            return None
        found = next((m for m in map(_SESSION.search, links) if m), None)
    return int(found[1]) if found else None


def ray_processes(owners: set[int]) -> list[tuple[int, str]]:
    """Live Ray processes of the sessions the processes `owners` (run workers' pids) started."""
    leftovers = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if ("rb-ray-" in cmdline or "ray::" in cmdline) and _session_owner(process, cmdline) in owners:
            leftovers.append((process.info["pid"], cmdline[:200]))
    return leftovers


def worker_pid(result: object) -> int:
    return int(result.worker["pid"])  # type: ignore[attr-defined]
