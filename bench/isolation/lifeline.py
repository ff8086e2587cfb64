"""The worker's tie to its harness: when the harness is gone, the worker and everything it started go too.

The worker's stdin is a pipe whose only write end the harness holds. For a cold worker the harness
is its parent. For a worker forked from a warm worker, the harness sent the pipe's read end over the
socket. A daemon thread reads that pipe. Its first line is the job's path. End of file means the
harness exited, however it exited (SIGKILL included). The thread then SIGKILLs the worker's whole
process group, and the target's child processes die with it (the worker leads its own session).

On Linux a cold worker also asks the kernel for a signal when its parent dies (PR_SET_PDEATHSIG). The
signal is SIGHUP, handled by the same group kill, not SIGKILL: SIGKILL would end the worker before it
could end its children. This is a second guard. A forked worker does not ask: its parent is the warm
worker, and the warm worker exiting must not end runs. For forked workers the pipe is the only tie.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Lifeline:
    """Reads the harness's pipe on a daemon thread: the job line first, then waits for end of file."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._job: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._read, name="rollout-bench lifeline", daemon=True)

    def start(self) -> Lifeline:
        self._thread.start()
        return self

    async def job_line(self) -> str:
        """The first line the harness sent (the job file's path)."""
        return await asyncio.wrap_future(self._job)

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            if not self._job.done():
                pending += chunk
                if b"\n" in pending:
                    self._job.set_result(pending.split(b"\n", 1)[0].decode(errors="replace"))
        harness_gone()


def harness_gone() -> None:
    """SIGKILL this worker's process group (this process with it): nobody is left to read its results."""
    try:
        sys.stderr.write("rollout-bench worker: the harness's pipe closed (the harness ended); "
                         "killing the worker's process group\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    group = os.getpgid(0)
    if group == os.getpid():  # a session of its own, as the harness starts it: never a shell's job group
        os.killpg(group, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent() -> None:
    """Linux: when this process's parent exits, the kernel sends SIGHUP, and the handler ends the group."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    signal.signal(signal.SIGHUP, lambda signum, frame: harness_gone())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGHUP), 0, 0, 0)
    except (OSError, AttributeError):
        pass
