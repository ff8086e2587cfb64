"""`ref-step-weights`: a synchronous trainer that publishes its weights itself between steps, through the server's
admin routes, as slime's trainer does for its SGLang engines (for `run --steps K`: the adapter's `update_weights`,
the `step_weights` check in `bench.steps.checks`).

Before every step (step 0 too: the weights the trainer starts from) the trainer side pauses generation, flushes the
cache, sends the new weights with their version (`/update_weights_from_tensor`, `weight_version` = the step's
number; no tensors: the mock has no model) and continues generation. Each step then generates its trajectories
once over SGLang's `/generate` and hands them to the trainer.

- `unfixed`: its sync is conditional and the condition is wrong for one step (`--target-option skip=K`, default
  2: the step whose sync it skips, as an interval computed off by one or a flag reset too early would): the
  trainer moves to version K, the server keeps serving K-1. With `--target-option drop_version=K` it sends step
  K's sync but the update names no version (a request builder that lost the field): the server takes the weights
  and keeps its label at K-1, which a slime-like trainer must not do (only AReaL's and verl's syncs name none).
- `fixed`: it syncs before every step.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import aiohttp

from bench.records.sample import SampleRecord

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, sample_of
from . import ReferenceTarget

FLUSH_ATTEMPTS = 20  # flush_cache answers 400 while requests are still in flight: try again shortly


class RefStepWeights(ReferenceTarget):
    family = "ref-step-weights"

    def framework_info(self) -> dict[str, str]:
        return {"framework": "aiohttp", "version": importlib.metadata.version("aiohttp")}

    async def update_weights(self, job: RolloutJob) -> str:
        """The trainer side before step `job.step`: publish version `job.step` (the one it trains from)."""
        version = str(job.step)
        dropped = job.options.get("drop_version")
        skip = int(job.options.get("skip", 2)) if dropped is None else None
        if not self.fixed and job.step == skip:
            return version  # the trainer moved on; the sync was never sent
        update: dict[str, Any] = {"serialized_named_tensors": [], "flush_cache": False, "weight_version": version}
        if not self.fixed and dropped is not None and job.step == int(dropped):
            del update["weight_version"]  # sent, naming no version
        async with aiohttp.ClientSession() as http:
            await _post(http, job.base_url, "/pause_generation", {})
            await _flush(http, job.base_url)
            await _post(http, job.base_url, "/update_weights_from_tensor", update)
            await _post(http, job.base_url, "/continue_generation", {})
        return version

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            samples = await asyncio.gather(*(self._sample(http, limit, job, spec) for spec in job.trajectories))
        for sample in samples:
            emit(sample)

    async def _sample(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                      spec: TrajectorySpec) -> SampleRecord:
        async with limit:
            body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
        return sample_of(spec, body)


async def _post(http: aiohttp.ClientSession, base_url: str, route: str, body: dict[str, Any]) -> None:
    async with http.post(f"{base_url}{route}", json=body) as reply:
        reply.raise_for_status()


async def _flush(http: aiohttp.ClientSession, base_url: str) -> None:
    for _ in range(FLUSH_ATTEMPTS):
        async with http.get(f"{base_url}/flush_cache") as reply:
            if reply.status == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{base_url}/flush_cache: still refused after {FLUSH_ATTEMPTS} attempts")
