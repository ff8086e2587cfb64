"""Plug-in targets for the retry-discipline and vacuity tests: small, correct rollout loops
(one model call per trajectory, SGLang `/generate`), plugged in by `module:attr`."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from bench import Emit, RolloutJob, SampleRecord, TrajectorySpec
from bench.targets.client import generate, output_of

_OUTCOME = {"stop": "completed", "length": "truncated"}


def _record(spec: TrajectorySpec, body: dict) -> SampleRecord:
    ids, logprobs, _, finish = output_of(body)
    return SampleRecord(spec.id, spec.group, _OUTCOME.get(finish, "aborted"), status=finish.upper(),
                        prompt_length=len(spec.prompt_ids), response_ids=ids, logprobs=logprobs,
                        loss_mask=[1] * len(ids), response_length=len(ids),
                        weight_versions=[str(body["meta_info"].get("weight_version"))])


class RetriesTransientErrors:
    """A correct per-request retrier: a transient failure (an error status, a cut connection, a
    body that does not parse) gets up to three more attempts; the router's no-workers 503 and a
    400 are final at once. Each trajectory ends completed, truncated, aborted or failed."""

    name = "tests:retries-transient-errors"
    fail_fast = False
    retries = 3

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(self._one(http, limit, job, spec, emit) for spec in job.trajectories))

    async def _one(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                   spec: TrajectorySpec, emit: Emit) -> None:
        error = ""
        for _ in range(1 + self.retries):
            try:
                async with limit:
                    body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
                emit(_record(spec, body))
                return
            except aiohttp.ClientResponseError as failure:
                error = f"HTTP {failure.status}"
                if failure.status in (400, 503):
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, KeyError, TypeError,
                    ValueError) as failure:
                error = repr(failure)
        emit(SampleRecord(spec.id, spec.group, "failed", status="ERROR", prompt_length=len(spec.prompt_ids),
                          details={"error": error}))


class FailsClosed:
    """Fail-fast by policy: sends its trajectories one at a time, in order, and raises on the first
    error it sees, so nothing after it is ever requested."""

    name = "tests:fails-closed"
    fail_fast = True

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                try:
                    body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
                except aiohttp.ClientResponseError as failure:
                    raise RuntimeError(f"{spec.id}: the server answered {failure.status}; stopping the batch") \
                        from failure
                emit(_record(spec, body))


class StopsHalfway:
    """Returns after its first half of trajectories, never requesting the rest (a bug: accounting's)."""

    name = "tests:stops-halfway"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories[: len(job.trajectories) // 2]:
                emit(_record(spec, await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)))
