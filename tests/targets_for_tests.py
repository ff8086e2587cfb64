"""Tiny targets for harness tests, plugged in by `module:attr` as a user's own would be."""

from __future__ import annotations

import asyncio

from bench.targets import Emit, RolloutJob, SampleRecord


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
