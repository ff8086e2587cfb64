"""A plug-in target that spends its first seconds inside `run()`, as a framework starting Ray does."""

from __future__ import annotations

import asyncio

import aiohttp

from bench import Emit, ErrorInfo, RolloutJob, SampleRecord
from bench.targets.client import generate


class SlowStart:
    """Sleeps `job.options["sleep_s"]` (default 1) before its first request, then sends each
    trajectory's recorded first turn once: a 200 is `completed`, an error `failed`."""

    name = "tests:slow-start"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit, sleep_s: float | None = None) -> None:
        await asyncio.sleep(float(job.options.get("sleep_s", 1.0)) if sleep_s is None else sleep_s)
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                try:
                    await generate(http, job.base_url, spec, list(spec.prompt_ids), dict(spec.sampling_params))
                except aiohttp.ClientResponseError as error:
                    emit(SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                                      error=ErrorInfo.of(error)))
                else:
                    emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))


class Preparing(SlowStart):
    """Spends `job.options["prepare_s"]` in `prepare(job)` (a framework's start-up: Ray, actors) and then runs
    like SlowStart without its sleep; `job.options["prepare_fails"]` makes the start-up raise instead."""

    name = "tests:preparing"

    def prepare(self, job: RolloutJob) -> None:
        import time

        time.sleep(float(job.options.get("prepare_s", 1.0)))
        if job.options.get("prepare_fails"):
            raise RuntimeError("the framework's start-up failed")
        self.prepared = True

    async def run(self, job: RolloutJob, emit: Emit, sleep_s: float | None = None) -> None:
        assert getattr(self, "prepared", False), "run() before prepare()"
        await super().run(job, emit, sleep_s=0.0)
