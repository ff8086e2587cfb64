"""Targets that misbehave the way real frameworks do, to show the worker process contains them."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import time

from bench import Emit, RolloutJob, SampleRecord


def _record(spec, outcome: str = "completed") -> SampleRecord:  # type: ignore[no-untyped-def]
    return SampleRecord(spec.id, spec.group, outcome, prompt_length=len(spec.prompt_ids))


class DiesHard:
    """Emits two records, then the process vanishes (a segfault or an os._exit in native code)."""

    name = "isolation:dies-hard"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for spec in job.trajectories[:2]:
            emit(_record(spec))
        os._exit(9)


class LeaksAndRaises:
    """Starts tasks and a non-daemon thread that never end, prints to stdout, then raises."""

    name = "isolation:leaks"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        print("framework chatter on stdout " * 50)  # must not corrupt the message channel
        self.leftovers = [asyncio.get_running_loop().create_task(asyncio.Event().wait()) for _ in range(3)]
        threading.Thread(target=time.sleep, args=(3600,), name="leaked-forever").start()
        for spec in job.trajectories[:-1]:
            emit(_record(spec))
        raise KeyError("reward function crashed")


def _spin_in_place() -> None:
    while True:
        time.sleep(0.05)


class BlocksTheLoop:
    """Emits one record, then blocks its event loop in synchronous code (no await ever returns)."""

    name = "isolation:blocks"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        emit(_record(job.trajectories[0]))
        sys.stdout.flush()
        _spin_in_place()


class ReportsInterpreter:
    """Completes every trajectory; says which interpreter ran it (in `details`)."""

    name = "isolation:interpreter"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for spec in job.trajectories:
            record = _record(spec)
            record.details = {"python": sys.executable, "pid": os.getpid(),
                              "sees_pytest": importlib.util.find_spec("pytest") is not None}
            emit(record)
