"""`ref-step-async`: an asynchronous rollout that trains on samples generated under earlier steps' weights (for
`run --steps K`, the `step_lag` check in `bench.steps.checks`).

Each step generates its trajectories under the step's weights into a process-wide buffer of groups, and hands the
trainer the oldest group in the buffer (`--target-option per_step=G` groups, default 1): generation runs ahead of
training, as in AReaL's or slime's async mode. The last step drains the buffer. The framework is configured to
accept samples at most `max_staleness` versions old (`--target-option max_staleness=N`, default 1), and the adapter
declares that bound (`framework_info()["max_weight_lag"]`), so the bench judges the lag against it.

- `unfixed`: the buffer is handed over oldest first whatever its age: with a step's batch larger than what a step
  trains on, the backlog grows and so does the lag of what is trained on, past the configured bound.
- `fixed`: before handing over, groups older than `max_staleness` versions are taken out of the buffer and
  reported as `dropped` (a `Stale` error naming the versions), as a staleness-controlled buffer discards them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections import deque
from typing import Any

import aiohttp

from bench.records.sample import ErrorInfo, SampleRecord

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, sample_of
from . import ReferenceTarget



class RefStepAsync(ReferenceTarget):
    family = "ref-step-async"

    def __init__(self, variant: str = "unfixed") -> None:
        super().__init__(variant)
        self._buffer: deque[list[SampleRecord]] = deque()  # groups generated, not yet trained on (across steps)
        self.max_staleness = 1

    def framework_info(self) -> dict[str, str]:
        return {"framework": "aiohttp", "version": importlib.metadata.version("aiohttp"),
                "max_weight_lag": str(self.max_staleness)}

    def warm_up(self, options: dict[str, Any]) -> None:
        self.max_staleness = int(options.get("max_staleness", 1))  # known before the report asks framework_info

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        self.max_staleness = int(job.options.get("max_staleness", 1))
        per_step = int(job.options.get("per_step", 1))
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            samples = await asyncio.gather(*(self._sample(http, limit, job, spec) for spec in job.trajectories))
        for members in job.groups().values():
            self._buffer.append([next(s for s in samples if s.trajectory == spec.id) for spec in members])
        if self.fixed:
            while self._buffer and self._age(self._buffer[0], job.step) > self.max_staleness:
                for sample in self._buffer.popleft():
                    emit(self._stale(sample, job.step))
        take = len(self._buffer) if job.step == job.steps - 1 else per_step  # the last step drains the buffer
        for _ in range(min(take, len(self._buffer))):
            for sample in self._buffer.popleft():
                emit(sample)

    @staticmethod
    def _age(group: list[SampleRecord], step: int) -> int:
        return max(step - int(v) for s in group for v in s.weight_versions if v.isdigit())

    def _stale(self, sample: SampleRecord, step: int) -> SampleRecord:
        sample.outcome = "dropped"
        sample.error = ErrorInfo("Stale", f"served v{','.join(sample.weight_versions)}, trained at step {step}: "
                                          f"more than {self.max_staleness} versions behind", "", sample.trajectory)
        return sample

    async def _sample(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                      spec: TrajectorySpec) -> SampleRecord:
        async with limit:
            body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
        return sample_of(spec, body)
