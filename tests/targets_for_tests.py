"""Tiny targets for harness tests, plugged in by `module:attr` as a user's own would be."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from bench import Emit, RolloutJob, SampleRecord


class Hangs:
    """Finishes half its trajectories, then waits forever (like drop-without-replenish)."""

    name = "tests:hangs"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for spec in job.trajectories[: len(job.trajectories) // 2]:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))
        await asyncio.Event().wait()


class Duplicates:
    """Reports one trajectory twice and another never: accounting must notice."""

    name = "tests:duplicates"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        first = job.trajectories[0]
        for spec in [first, first, *job.trajectories[2:]]:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))


def _hosting_run() -> int:
    """The pid of the `rollout-bench run` process hosting this target: the worker's parent when the
    target runs isolated (`python -m bench.isolation.worker`), else this very process."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return os.getppid() if spec is not None and spec.name == "bench.isolation.worker" else os.getpid()


class KillsTheRun:
    """SIGKILLs the run hosting it, so no report is written: a sweep must still record the run.
    Only for `rollout-bench run` subprocesses (inline in a test process it would kill the tests)."""

    name = "tests:kills-the-run"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        os.kill(_hosting_run(), signal.SIGKILL)
        os._exit(1)  # isolated: the worker goes with its run


class FreezesTheRun:
    """SIGSTOPs the run hosting it: its own watchdog is frozen too, only a sweep's timeout ends it.
    Only for `rollout-bench run` subprocesses, like `KillsTheRun`."""

    name = "tests:freezes-the-run"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        run = _hosting_run()
        os.kill(run, signal.SIGSTOP)
        os._exit(0)  # isolated: the frozen run is left alone to be killed; inline: not reached until then
