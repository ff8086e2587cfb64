"""Looking at processes from tests: is a worker still there."""

from __future__ import annotations

import os
import subprocess


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed process whose parent died waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_until_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after `timeout_s` seconds (empty when all are gone)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid in pids if running(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def end(process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGKILL a process the test started if it still runs, and reap it (a test's `finally`)."""
    if process.poll() is None:
        process.kill()
        process.wait()
