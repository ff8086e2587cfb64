"""`ref-step-drift`: a rollout whose later steps give other results than a fresh process would, without raising
(for `run --steps K --compare-fresh`, `bench.steps.fresh`).

The rollout enforces its own response-length limit (`--target-option max_response_tokens=N`, default 192): a
longer answer is clipped to the limit and kept as truncated, and after a clipped answer the limit halves for the
rest of the step (an overlong backoff, meant per step). Answers are clipped in the step's trajectory order,
after all came back, so the same inputs give the same result.

- `unfixed`: the backoff writes the halved limit into the process-wide rollout config (a module-level args
  object), so every later step starts from the lowered limit: its samples come back clipped where a fresh
  process running the same step keeps them whole. Nothing raises; only the results differ.
- `fixed`: each step backs off on its own copy of the config, and starts from the configured limit.
"""

from __future__ import annotations

import asyncio

import aiohttp

from bench.records.sample import SampleRecord

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import OUTCOME_OF_FINISH, generate, output_of
from . import ReferenceTarget

DEFAULT_LIMIT = 192
_CONFIG: dict[str, int] = {}  # process-wide, as a trainer's parsed args are
_OUTCOME = OUTCOME_OF_FINISH


class RefStepDrift(ReferenceTarget):
    family = "ref-step-drift"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _CONFIG.setdefault("max_response_tokens", int(job.options.get("max_response_tokens", DEFAULT_LIMIT)))
        config = dict(_CONFIG) if self.fixed else _CONFIG  # the fix: the step's backoff stays the step's
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            async def one(spec: TrajectorySpec) -> dict:
                async with limit:
                    return await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)

            bodies = await asyncio.gather(*(one(spec) for spec in job.trajectories))
        for spec, body in zip(job.trajectories, bodies):
            emit(self._sample(spec, body, config))

    def _sample(self, spec: TrajectorySpec, body: dict, config: dict[str, int]) -> SampleRecord:
        ids, logprobs, _, finish = output_of(body)
        cap = config["max_response_tokens"]
        outcome = _OUTCOME.get(finish, "failed")
        if len(ids) > cap:  # clipped to the rollout's own limit, kept as truncated; then the backoff
            ids, logprobs, outcome = ids[:cap], None if logprobs is None else logprobs[:cap], "truncated"
            config["max_response_tokens"] = max(1, cap // 2)
        return SampleRecord(trajectory=spec.id, group=spec.group, outcome=outcome, status=finish.upper(),
                            prompt_length=len(spec.prompt_ids), response_ids=ids, logprobs=logprobs,
                            loss_mask=[1] * len(ids), response_length=len(ids), reward=1.0,
                            weight_versions=[str(body["meta_info"].get("weight_version"))], attempt=1,
                            request_ids=[str(body["meta_info"]["id"])] if body["meta_info"].get("id") else [])
