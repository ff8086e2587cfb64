"""The harness side of process isolation: a target adapter that runs the real one in a worker.

`IsolatedTarget` looks like any adapter to the runner (`name`, `fail_fast`, `run(job, emit)`),
but `run` starts `python -m bench.isolation.worker` (under `python`, which may be another
virtual environment's interpreter), relays the records it streams back, re-raises the
rollout's exception as `TargetCrashed` with the original type, message and traceback, and
kills the worker's whole process group, and every process that left it (`escapees`), whatever
happened. The worker's stdout carries the protocol; its stderr (the target's logs) comes back through a
pipe, capped (`capped_log`), and is written to `log_path` when one is given (the report writes it as
`worker.log` either way). Nothing is written to the temp folder: the job goes down the worker's stdin as
one line, and the hang stacks go to anonymous temporary files both sides hold open.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.records.sample import ErrorInfo
from bench.targets.base import Emit, RolloutJob
from bench.targets.frameworks.envs import IMPORT_ERRORS, missing_environment_hint

from .capped_log import CappedLog, LogPipe
from .escapees import RUN_MARKER, kill_marked, new_marker
from .protocol import TASK_MARKER, decode, error_from_dict, job_to_json, record_from_dict
from .warm_client import WarmProcess, fork_from_warm

LINE_LIMIT = 64 * 1024 * 1024  # one record line holds a whole trajectory's ids and logprobs


class TargetStartError(RuntimeError):
    """The worker could not load the target (unknown name, package missing from that interpreter)."""


class TargetCrashed(RuntimeError):
    """The rollout raised inside the worker; `info` is the original exception's type, message and traceback."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(f"{info.type}: {info.message}")
        self.info = info


class WorkerDied(RuntimeError):
    """The worker process ended without saying the rollout finished (killed, segfault, os._exit)."""


def _source_root() -> str:
    """The folder holding the `bench` and `faults` packages, for a worker whose interpreter lacks them."""
    return str(Path(__file__).resolve().parents[2])


def worker_env(python: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER}  # each run sets its own
    # Same environment = same bin folder. Not `resolve()`: every venv's python is a symlink to one base
    # interpreter, and resolving would hand another environment this one's site-packages.
    same = Path(os.path.abspath(python)).parent == Path(os.path.abspath(sys.executable)).parent
    # The same interpreter sees what the harness sees (test-local plug-ins included); another one gets
    # only the bench's source root, after its own site-packages, so its pinned libraries win.
    entries = [p for p in sys.path if p and os.path.isdir(p)] if same else [_source_root(), os.getcwd()]
    if env.get("PYTHONPATH"):
        entries.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def _read(file: Any) -> str:
    """All of an anonymous file the worker writes (at its own offset: read from the start, without seeking)."""
    size = os.fstat(file.fileno()).st_size
    return os.pread(file.fileno(), size, 0).decode(errors="replace") if size else ""


def _task_stacks(file: Any) -> list[str]:
    """One entry per pending asyncio task (the worker separates them with its marker)."""
    return [TASK_MARKER + chunk.strip() for chunk in _read(file).split(TASK_MARKER) if chunk.strip()]


def _thread_stacks(file: Any) -> list[str]:
    """One entry per thread, from faulthandler's blank-line separated blocks."""
    return [chunk.strip() for chunk in _read(file).split("\n\n") if chunk.strip()]


class IsolatedTarget:
    """Runs target `spec` in a worker process under `python` (default: this interpreter)."""

    def __init__(self, spec: str, python: str | None = None, log_path: str | Path | None = None, *,
                 warm: bool = True) -> None:
        self.spec = spec
        self.warm = warm  # fork from a warm worker (`rollout-bench worker`) when one runs for this target
        self.forked_from_warm = False
        self.warm_note = ""  # why a warm worker was there but not used
        self.python = python or sys.executable
        self.name = spec
        self.fail_fast = False
        self.tokens_source = "served"  # what the target's adapter declares (`bench.targets.tokens_source_of`)
        self.versions: dict[str, str] = {}
        self.framework: dict[str, str] | None = None  # what the target says about its framework's code
        self.worker_pid: int | None = None
        self.worker_cpu_s: float | None = None
        self.startup_s: float | None = None  # the worker's interpreter start, target import and warm-up
        self.prepare_s: float | None = None  # from `hello` to the target's `prepare(job)` done (Ray, actors)
        self._hello_at: float | None = None
        self._spawned: float | None = None
        self.leaked_tasks = 0
        self.returned_at: float | None = None  # unix time the rollout returned or raised
        self.log_path = Path(log_path) if log_path else None  # also written here at the end, when given
        self._log = CappedLog()
        self._log_pipe: LogPipe | None = None
        self.marker = new_marker()  # in the environment of every process this run's worker starts
        # faulthandler's thread stacks and the pending tasks' stacks: unlinked files, gone with the last holder
        self._stacks, self._tasks = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._finished = False
        self._process: asyncio.subprocess.Process | WarmProcess | None = None
        self.started = asyncio.Event()  # the worker loaded the target (its imports can take many seconds)

    async def start(self, options: dict[str, Any]) -> None:
        """Spawn the worker now, so it imports the framework while the harness loads the trace."""
        if self._process is not None:
            return
        self._spawned = time.monotonic()
        self._log_pipe = LogPipe(self._log)
        env = {**worker_env(self.python), RUN_MARKER: self.marker}
        stack_fds = (self._stacks.fileno(), self._tasks.fileno())
        try:
            if self.warm:
                forked, self.warm_note = await fork_from_warm(self.python, self.spec, options, stack_fds,
                                                              self._log_pipe.write_fd, env, LINE_LIMIT)
                if forked is not None:
                    self._process, self.worker_pid, self.forked_from_warm = forked, forked.pid, True
                    return
            try:
                self._process = await asyncio.create_subprocess_exec(
                    self.python, "-m", "bench.isolation.worker", self.spec, json.dumps(options),
                    "fd:{},{}".format(*stack_fds), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=self._log_pipe.write_fd, pass_fds=stack_fds, env=env, start_new_session=True,
                    limit=LINE_LIMIT)
            except OSError as error:
                raise TargetStartError(f"target {self.spec!r}: cannot start the worker interpreter "
                                       f"{self.python}: {error}") from None
            self.worker_pid = self._process.pid
        finally:
            self._log_pipe.close_write_end()  # the worker holds its copy: end of file when it and its children end

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        await self.start(job.options)
        assert self._process is not None and self._process.stdin is not None
        try:
            try:
                self._process.stdin.write(job_to_json(job).encode() + b"\n")  # one line: JSON escapes newlines
                await self._process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the worker already ended (a start error): its messages say why
            await self._relay(emit)
        except asyncio.CancelledError:
            self._kill()  # the watchdog gave up on it: no grace period
            raise
        finally:
            await self._stop()

    async def close(self) -> None:
        """End a worker that was started but never given a job (the trace or server failed to load), and
        whatever its run left: escaped processes, the log pipe, the stack files."""
        if self._process is not None and self._process.returncode is None:
            self._kill()
            await self._process.wait()
        await self._finish()

    async def _finish(self) -> None:
        """Once the worker is gone: kill what escaped its group, collect the last of its output, write the log."""
        if self._finished:
            return
        self._finished = True
        await asyncio.to_thread(kill_marked, RUN_MARKER, self.marker)
        if self._log_pipe is not None:
            await asyncio.to_thread(self._log_pipe.wait, 2.0)  # a holder that escaped the marker: stop waiting
        if self.log_path is not None:
            self._log.write(self.log_path)
        self._stacks.close()
        self._tasks.close()

    def log_text(self) -> str:
        """The target's output (capped: `capped_log`)."""
        return self._log.text()

    async def _relay(self, emit: Emit) -> None:
        assert self._process is not None and self._process.stdout is not None
        crashed: ErrorInfo | None = None
        done = False
        line_number = 0
        while line := await self._process.stdout.readline():
            line_number += 1
            message = decode(line, f"worker {self.spec} stdout line {line_number}")
            kind = message["kind"]
            if kind == "hello":
                self.name, self.fail_fast = message["target"], bool(message["fail_fast"])
                self.tokens_source = message.get("tokens_source", "served")
                self.versions = message.get("versions", {})
                self.framework = message.get("framework")
                self.startup_s = round(time.monotonic() - (self._spawned or time.monotonic()), 3)
                self._hello_at = time.monotonic()
                if not message.get("prepares"):
                    self.started.set()
            elif kind == "ready":  # a target that prepares for its job (`prepare`) has done so
                self.prepare_s = round(time.monotonic() - self._hello_at, 3) if self._hello_at else None
                self.started.set()
            elif kind == "record":
                emit(record_from_dict(message["record"]))
            elif kind == "error":
                crashed = error_from_dict(message["error"])
                self.returned_at = float(message.get("at", time.time()))
            elif kind == "done":
                self.returned_at = self.returned_at or float(message.get("at", time.time()))
                self.worker_cpu_s, self.leaked_tasks = message.get("cpu_s"), int(message.get("leaked_tasks", 0))
                done = True
                break
            elif kind == "fatal":
                error = error_from_dict(message["error"])
                fell_back = os.path.abspath(self.python) == os.path.abspath(sys.executable)  # no --python, no env
                hint = missing_environment_hint(self.spec) if error.type in IMPORT_ERRORS and fell_back else None
                raise TargetStartError(f"target {self.spec!r} could not start under {self.python}: "
                                       f"{error.type}: {error.message}" + (f"\n{hint}" if hint else "") +
                                       f"\n{await asyncio.to_thread(self._log_tail)}")
        if not done:
            status = await self._process.wait()
            raise WorkerDied(f"worker for {self.spec!r} (pid {self.worker_pid}) exited with status {status} "
                             f"before the rollout finished; its log (worker.log in the report) ends:\n"
                             f"{await asyncio.to_thread(self._log_tail)}")
        if crashed is not None:
            raise TargetCrashed(crashed)

    async def dump_stacks(self, settle_s: float = 0.5) -> list[str]:
        """Every thread's stack and the pending asyncio tasks of a worker that stopped making progress."""
        if self._process is None or self._process.returncode is not None:
            return []
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # threads first (always works), then tasks (if the loop runs)
            try:
                os.kill(self._process.pid, sig)
            except ProcessLookupError:
                return []
            await asyncio.sleep(settle_s)
        return _task_stacks(self._tasks) + _thread_stacks(self._stacks)

    async def _stop(self) -> None:
        """The worker exits by itself after `done`; anything else (hang, crash, cancel) is killed, group and all."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
        self._kill()
        if process.returncode is None:
            await process.wait()
        await self._finish()

    def _kill(self) -> None:
        """SIGKILL the worker's process group (it leads its own session, so its children go too), then every
        process carrying this run's marker (children that left the group with `setsid`)."""
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            kill_marked(RUN_MARKER, self.marker)

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_pipe is not None:
            self._log_pipe.wait(2.0)  # the worker ended: its last lines are in the pipe
        text = self._log.text()
        return "\n".join(text.splitlines()[-lines:]) if text else "(the worker wrote nothing)"

    def framework_info(self) -> dict[str, str] | None:
        """What the target in the worker said about its framework's code (its `framework_info()`)."""
        return self.framework

    def describe(self) -> dict[str, Any]:
        return {"spec": self.spec, "python": self.python, "pid": self.worker_pid, "cpu_s": self.worker_cpu_s,
                "startup_s": self.startup_s, "prepare_s": self.prepare_s, "forked_from_warm": self.forked_from_warm,
                **({"warm_note": self.warm_note} if self.warm_note else {}),
                "leaked_tasks": self.leaked_tasks, "versions": self.versions,
                "log": str(self.log_path) if self.log_path else None, "log_bytes_left_out": self._log.dropped}
