"""`python -m bench.isolation.worker TARGET OPTIONS fd:STACKS,TASKS`: one target run in its own process.

The harness starts the worker first; it loads the target (and calls its optional
`warm_up(options)`, where a framework's slow imports belong) while the harness loads the trace
and starts the server, says `hello`, then reads the job (one JSON line) from stdin and runs it.
Stdin stays open for the whole run: when it reaches end of file, the harness is gone, and the
worker kills its own process group (`lifeline`).

Frameworks bind HTTP clients and singletons to the first event loop, keep orphaned tasks
alive after a crash and print freely; so a target runs here, alone, and the process ends
(`os._exit`) the moment the rollout returns or raises: nothing it leaked survives into the
harness or the next scenario. Messages go to the original stdout (see `protocol`); the
target's own output is redirected to stderr, which the harness keeps as the worker log.

On SIGUSR1 every thread's stack is written to the file open as descriptor STACKS (faulthandler: works
even when the event loop is blocked); on SIGUSR2 the pending asyncio tasks' stacks replace the content of
TASKS (works when the loop is alive). The harness asks for both when its watchdog sees a hang; it made
both files and holds them open, unlinked, so nothing is left on disk however the run ends.

A `sys.exit()` in the rollout is the batch crashing with `SystemExit` and its code, not the worker ending:
asyncio would let it out of the event loop and report the cancelled main task instead.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import json
import os
import platform
import signal
import sys
import time
import traceback
from typing import Any, BinaryIO

from bench.records import attribution
from bench.records.sample import ErrorInfo, SampleRecord

from .exits import error_info, exits_as_errors, print_awaited
from .lifeline import Lifeline, die_with_parent
from .protocol import TASK_MARKER, encode, error_to_dict, job_from_json, record_to_dict


class _Channel:
    """The message stream: the process's original stdout, flushed per message."""

    def __init__(self) -> None:
        self._out: BinaryIO = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)  # the target's prints (and any child process's) go to the log, not the channel
        sys.stdout = sys.stderr

    def send(self, kind: str, **fields: Any) -> None:
        self._out.write(encode(kind, **fields))


def _versions() -> dict[str, str]:
    import importlib.metadata

    out = {"python": platform.python_version()}
    for package in ("miles-rl", "verifiers", "openai", "torch", "transformers", "aiohttp", "httpx"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _dump_tasks(tasks_fd: int, worker_task: asyncio.Task[Any] | None) -> None:
    """The target's pending tasks (not the worker's own, which only awaits the target)."""
    buffer = io.StringIO()
    for task in asyncio.all_tasks() - {worker_task}:
        buffer.write(f"{TASK_MARKER}{task.get_name()} ---\n")
        task.print_stack(file=buffer)
        print_awaited(task.get_coro(), buffer)
    data = buffer.getvalue().encode()
    os.ftruncate(tasks_fd, 0)
    os.pwrite(tasks_fd, data, 0)


async def _run(channel: _Channel, target_spec: str, options: dict[str, Any], tasks_fd: int,
               lifeline: Lifeline) -> int:
    from bench.targets import framework_info_of, resolve_target, tokens_source_of

    try:
        target = resolve_target(target_spec)
        tokens_source = tokens_source_of(target)  # a bad declaration stops the start, naming the target
        warm_up = getattr(target, "warm_up", None)
        if warm_up is not None:  # the framework's imports, while the harness loads its trace
            await asyncio.to_thread(warm_up, options)
        framework = framework_info_of(target)  # after warm-up: a checkout is known once it is loaded
    except BaseException as error:  # noqa: BLE001 - anything that stops the start is reported, then exit 3
        channel.send("fatal", error=error_to_dict(ErrorInfo.of(error)))
        return 3
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks, tasks_fd, asyncio.current_task())
    prepare = getattr(target, "prepare", None)
    channel.send("hello", target=target.name, fail_fast=bool(target.fail_fast), pid=os.getpid(),
                 tokens_source=tokens_source, framework=framework, prepares=prepare is not None,
                 python=sys.executable, versions=_versions())
    job_line = await lifeline.job_line()
    if not job_line.strip():
        return 0  # the harness gave up before sending a job (its trace or server failed to load)
    job = job_from_json(job_line)

    def emit(record: SampleRecord) -> None:
        channel.send("record", record=record_to_dict(record))

    attribution.install()  # after the target's imports: its HTTP clients are loaded by now
    before = asyncio.all_tasks()
    try:
        if job.steps > 1:  # `run --steps K`: K rollouts in this process, each step's end reported to the bench
            from bench.steps.loop import run_steps

            await run_steps(target, job, emit, on_prepared=None if prepare is None else
                            lambda: channel.send("ready", at=time.time()))
        else:
            if prepare is not None:  # the framework's own start-up for this job (Ray, actors): not yet the rollout
                await asyncio.to_thread(prepare, job)
                channel.send("ready", at=time.time())
            await asyncio.create_task(exits_as_errors(target.run(job, emit)), name=f"target {target.name}")
    except BaseException as error:  # noqa: BLE001 - the batch crashing is a result, reported in full
        channel.send("error", error=error_to_dict(error_info(error)), at=time.time())
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    channel.send("done", cpu_s=round(time.process_time(), 4), leaked_tasks=len(leaked), at=time.time())
    return 0


def main(argv: list[str] | None = None, *, parent_is_harness: bool = True) -> None:
    """Run one target; `parent_is_harness` is False in a child forked by a warm worker (see `lifeline`)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        sys.stderr.write("usage: python -m bench.isolation.worker TARGET OPTIONS_JSON fd:STACKS,TASKS  "
                         "(the job as one JSON line on stdin)\n")
        raise SystemExit(2)
    target_spec, options = args[0], json.loads(args[1])
    stacks_fd, tasks_fd = (int(fd) for fd in args[2].removeprefix("fd:").split(","))
    if parent_is_harness:
        die_with_parent()
    lifeline = Lifeline().start()  # from here on, the harness ending ends this process group
    channel = _Channel()
    faulthandler.register(signal.SIGUSR1, file=os.fdopen(stacks_fd, "w"), all_threads=True)
    try:
        status = asyncio.run(_run(channel, target_spec, options, tasks_fd, lifeline))
    except BaseException:  # noqa: BLE001 - last resort: the harness reads the log
        traceback.print_exc()
        status = 4
    sys.stderr.flush()
    os._exit(status)  # no atexit, no joining the target's threads: its leftovers die with the process


if __name__ == "__main__":
    main()
