"""The worker's tie to its harness: when the harness is gone, the worker and everything it started go too.

The worker's stdin is a pipe whose only write end the harness holds. For a cold worker the harness
is its parent. For a worker forked from a warm worker, the harness sent the pipe's read end over the
socket. A daemon thread reads that pipe. Its first line is the job (JSON). End of file means the
harness exited, however it exited (SIGKILL included). The thread then SIGKILLs every process carrying
the run's marker (children that left the group with `setsid`, see `escapees`) and the worker's whole
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

from .escapees import RUN_MARKER, kill_marked

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
        """The first line the harness sent (the job, as JSON)."""
        return await asyncio.wrap_future(self._job)

    def _read(self) -> None:
        pending = bytearray()
        while True:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                break
            if not self._job.done():
                pending += chunk
                if b"\n" in chunk:  # the job line can be megabytes: look only at what just came
                    self._job.set_result(bytes(pending.split(b"\n", 1)[0]).decode(errors="replace"))
                    pending = bytearray()
        harness_gone()


def harness_gone() -> None:
    """SIGKILL what this run started that left the group (`escapees`), then this worker's process group
    (this process with it): nobody is left to read its results."""
    try:
        sys.stderr.write("rollout-bench worker: the harness's pipe closed (the harness ended); "
                         "killing the worker's process group\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        kill_marked(RUN_MARKER, os.environ.get(RUN_MARKER))
    except Exception:  # noqa: BLE001 - the group kill below must happen whatever this met
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


def die_with_stdin() -> None:
    """For a `rollout-bench run` a sweep started: its stdin is a pipe only the sweep writes to. End of file
    means the sweep is gone (SIGKILL included): end this run's process group (it leads its own session);
    its workers follow through their own lifelines."""
    def read() -> None:
        while True:
            try:
                if not os.read(0, 65536):
                    break
            except OSError:
                break
        harness_gone()

    threading.Thread(target=read, name="rollout-bench sweep lifeline", daemon=True).start()
