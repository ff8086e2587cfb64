"""`ref-step-singleton`: a rollout whose process-wide state outlives a failed step (for `run --steps K`).

Rollout code keeps a module-level generation state across steps (slime's `GenerateState`, a rollout manager):
its semaphore, its tokenizer, an `aborted` flag an abort sets. A step that fails sets the flag on its way out.

- `unfixed`: the next step finds the flag still set and gives up at its first request ("the rollout was
  aborted"): a failure the earlier step left behind, on a valid reply.
- `fixed`: every step resets the state when it starts, as a trainer's `generate_rollout(rollout_id)` should.

Fail-fast, as slime: a trajectory that fails (an injected HTTP error) fails its step, loudly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from bench.records.attribution import trajectory_scope
from bench.records.sample import SampleRecord

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, sample_of
from . import ReferenceTarget



class RolloutAborted(RuntimeError):
    """The process-wide generation state says the rollout was aborted."""


@dataclass
class GenerateState:
    aborted: bool = False
    steps_seen: int = 0


_STATE = GenerateState()  # one per process, as a module-level singleton is


class RefStepSingleton(ReferenceTarget):
    family = "ref-step-singleton"
    fail_fast = True

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        if self.fixed:
            _STATE.aborted = False  # the fix: a step starts from a clean state
        _STATE.steps_seen += 1
        limit = asyncio.Semaphore(job.concurrency)
        try:
            async with aiohttp.ClientSession() as http:
                samples = await asyncio.gather(*(self._sample(http, limit, job, spec) for spec in job.trajectories))
        except BaseException:
            _STATE.aborted = True  # the abort path: stop what is in flight, then fail the step
            raise
        for sample in samples:
            emit(sample)

    async def _sample(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                      spec: TrajectorySpec) -> SampleRecord:
        async with limit:
            with trajectory_scope(spec.id):
                if _STATE.aborted:
                    raise RolloutAborted(f"the rollout was aborted (state from {_STATE.steps_seen - 1} steps)")
            body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
        return sample_of(spec, body)
