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

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        await asyncio.sleep(float(job.options.get("sleep_s", 1.0)))
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                try:
                    await generate(http, job.base_url, spec, list(spec.prompt_ids), dict(spec.sampling_params))
                except aiohttp.ClientResponseError as error:
                    emit(SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                                      error=ErrorInfo.of(error)))
                else:
                    emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))
