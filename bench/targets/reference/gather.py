"""`ref-gather`: a group rollout in the shape of slime's `generate_and_rm_group` (seed mode 000).

Each trajectory generates once, then post-processes its reply (parse and score; the place
where agentic rollouts raise after `generate()` returned: `faults.hooks.raise_if_poisoned`).

- `unfixed`: a bare `asyncio.gather` over the group's trajectories and over the groups. One
  trajectory raising propagates out of its group, then out of the whole rollout; the other
  trajectories run on orphaned and their results are thrown away.
- `fixed`: the group gathers with `return_exceptions=True`, logs the root cause and puts an
  ABORTED placeholder of the same fan-out shape (one masked token, reward 0) in place of the
  trajectory that raised; the rest of the batch completes.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from bench.records.sample import ErrorInfo, SampleRecord
from faults.hooks import raise_if_poisoned

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, output_of
from . import ReferenceTarget

log = logging.getLogger(__name__)
_OUTCOME = {"stop": "completed", "length": "truncated", "abort": "aborted"}


class RefGather(ReferenceTarget):
    family = "ref-gather"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(self._group(http, limit, job, members, emit) for members in job.groups().values()))

    async def _group(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                     members: list[TrajectorySpec], emit: Emit) -> None:
        tasks = [self._generate_and_score(http, limit, job, spec) for spec in members]
        if not self.fixed:
            samples = await asyncio.gather(*tasks)
        else:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            samples = []
            for spec, result in zip(members, results):
                if isinstance(result, BaseException):
                    log.error("trajectory %s raised; keeping an ABORTED placeholder", spec.id, exc_info=result)
                    samples.append(_placeholder(spec, result))
                else:
                    samples.append(result)
        for sample in samples:
            emit(sample)

    async def _generate_and_score(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                                  spec: TrajectorySpec) -> SampleRecord:
        async with limit:
            body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
        ids, logprobs, text, finish = output_of(body)
        raise_if_poisoned(text)  # post-processing: parse the reply, compute the reward
        return SampleRecord(
            trajectory=spec.id, group=spec.group, outcome=_OUTCOME.get(finish, "failed"), status=finish.upper(),
            prompt_length=len(spec.prompt_ids), response_ids=ids, logprobs=logprobs, loss_mask=[1] * len(ids),
            response_length=len(ids), reward=1.0 if finish == "stop" else 0.0,
            weight_versions=[str(body["meta_info"].get("weight_version"))], attempt=1,
            request_ids=[str(body["meta_info"]["id"])] if body["meta_info"].get("id") else [],
        )


def _placeholder(spec: TrajectorySpec, error: BaseException) -> SampleRecord:
    """The ABORTED sample contract: one masked token, zero reward, the error kept."""
    return SampleRecord(trajectory=spec.id, group=spec.group, outcome="aborted", status="ABORTED",
                        prompt_length=len(spec.prompt_ids), response_ids=[0], logprobs=None, loss_mask=[0],
                        response_length=1, reward=0.0, error=ErrorInfo.of(error))
