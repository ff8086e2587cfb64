"""Plug-in targets for the finite-logprob check: single-turn rollouts that train on the logprobs they are served
(`unfixed`), or fail a sample whose answer holds a logprob that is not a number (`fixed`)."""

from __future__ import annotations

import asyncio
import math

import aiohttp

from bench import TRAJECTORY_HEADER, Emit, ErrorInfo, RolloutJob, SampleRecord, TrajectorySpec
from bench.targets.client import output_of


class TrainsOnServedLogprobs:
    variants = ("unfixed", "fixed")
    fail_fast = False

    def __init__(self, variant: str = "unfixed") -> None:
        self.fixed = variant == "fixed"
        self.name = f"nan-logprobs:{variant}"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(self._one(http, job.base_url, spec, emit) for spec in job.trajectories))

    async def _one(self, http: aiohttp.ClientSession, base_url: str, spec: TrajectorySpec, emit: Emit) -> None:
        body = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
        async with http.post(f"{base_url}/generate", json=body, headers={TRAJECTORY_HEADER: spec.id}) as reply:
            answer = await reply.json()  # Python's json takes a bare NaN
        ids, logprobs, _, finish = output_of(answer)
        if self.fixed and logprobs is not None and not all(math.isfinite(lp) for lp in logprobs):
            emit(SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                              error=ErrorInfo("NonFiniteLogprob", "the answer's logprobs hold a NaN", "")))
            return
        emit(SampleRecord(spec.id, spec.group, "truncated" if finish == "length" else "completed", status=finish,
                          prompt_length=len(spec.prompt_ids), response_ids=ids, logprobs=logprobs,
                          loss_mask=[1] * len(ids), response_length=len(ids), reward=1.0,
                          request_ids=[answer["meta_info"]["id"]]))
