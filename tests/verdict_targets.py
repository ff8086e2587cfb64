"""Plug-in targets written the way a new user writes one from the README (plain aiohttp, no bench helpers,
no trajectory header), each with a bug the bench's verdict once misjudged (issue 13)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bench import Emit, RolloutJob, SampleRecord, TrajectorySpec

BAD_TRAJECTORY = "g00012-2"  # in the middle of the first 100 trajectories of either shipped trace


async def _generate(http: aiohttp.ClientSession, job: RolloutJob, spec: TrajectorySpec) -> dict[str, Any]:
    body = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
    async with http.post(f"{job.base_url}/generate", json=body) as reply:
        reply.raise_for_status()
        return await reply.json()


def _record(spec: TrajectorySpec, body: dict[str, Any], scores: dict[str, float]) -> SampleRecord:
    triples = body["meta_info"]["output_token_logprobs"]
    finish = body["meta_info"]["finish_reason"]["type"]
    return SampleRecord(spec.id, spec.group, "completed" if finish == "stop" else "truncated", status=finish,
                        prompt_length=len(spec.prompt_ids), response_ids=[t[1] for t in triples],
                        logprobs=[t[0] for t in triples], loss_mask=[1] * len(triples),
                        response_length=len(triples), reward=sum(scores.values()),
                        weight_versions=[str(body["meta_info"].get("weight_version"))])


def _score(spec: TrajectorySpec, body: dict[str, Any], bad: str) -> dict[str, float]:
    """The reward step, with its bug: one trajectory's reply lacks a score the code expects."""
    scores = {"accuracy": 1.0 if body["meta_info"]["finish_reason"]["type"] == "stop" else 0.0}
    if spec.id != bad:
        scores["format_reward"] = 0.5
    return {"accuracy": scores["accuracy"], "format": scores["format_reward"]}  # KeyError on `bad`


class GatherKeyError:
    """A bare `asyncio.gather` over all trajectories; the reward step raises KeyError on one valid reply."""

    name = "verdict:gather-keyerror"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        bad = job.options.get("bad", BAD_TRAJECTORY)
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:

            async def one(spec: TrajectorySpec) -> SampleRecord:
                async with limit:
                    body = await _generate(http, job, spec)
                return _record(spec, body, _score(spec, body, bad))

            records = await asyncio.gather(*(one(spec) for spec in job.trajectories))
        for record in records:
            emit(record)


class FixedGatherKeyError(GatherKeyError):
    """The same rollout with its reward step fixed (no reply lacks a score any more): the README's step 4."""

    name = "verdict:gather-keyerror-fixed"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        job.options["bad"] = None
        await super().run(job, emit)


class FailFastGatherKeyError(GatherKeyError):
    """The same bug, with the fail-fast policy declared: still a crash on a valid reply."""

    name = "verdict:gather-keyerror-failfast"
    fail_fast = True


class FailClosedOnAbort:
    """Fail-fast and correct: it raises when (and only when) the server aborts one of its requests."""

    name = "verdict:fail-closed"
    fail_fast = True

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:

            async def one(spec: TrajectorySpec) -> SampleRecord:
                body = await _generate(http, job, spec)
                if body["meta_info"]["finish_reason"]["type"] == "abort":
                    raise RuntimeError("the server aborted a request: refusing to train on a partial batch")
                return _record(spec, body, {"accuracy": 1.0})

            records = await asyncio.gather(*(one(spec) for spec in job.trajectories))
        for record in records:
            emit(record)


class RetriesMissingLogprobs:
    """Retries a reply without logprobs (correct), then builds the kept sample with a loss mask one token
    short (its own bug): the verdict must judge the attempt it kept, not blame the retried one's fault."""

    name = "verdict:retries-missing-logprobs"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                attempt, body = 1, await _generate(http, job, spec)
                while body["meta_info"].get("output_token_logprobs") is None:
                    attempt, body = attempt + 1, await _generate(http, job, spec)
                record = _record(spec, body, {"accuracy": 1.0})
                record.attempt, record.request_ids = attempt, [body["meta_info"]["id"]]
                if attempt > 1:
                    record.loss_mask = record.loss_mask[:-1]
                emit(record)


class FailsOnce:
    """Crashes on its first run only (a marker file remembers): a failure no rerun brings back."""

    name = "verdict:fails-once"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        import pathlib

        marker = pathlib.Path(job.options["marker"])
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                body = await _generate(http, job, spec)
                if not marker.exists():
                    marker.write_text("crashed once")
                    raise RuntimeError("a one-off failure")
                emit(_record(spec, body, {"accuracy": 1.0}))


class OwnToolOnly:
    """Scores the model's first turn and never runs a tool call it makes (it has a tool of its own, run
    offline): a tool-output fault cannot reach it."""

    name = "verdict:own-tool-only"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                emit(_record(spec, await _generate(http, job, spec), {"accuracy": 1.0}))


class DropsOneSilently:
    """Returns normally without a word about one trajectory (its group is left partial)."""

    name = "verdict:drops-one-silently"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        dropped = job.options.get("dropped", "g00001-2")
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                body = await _generate(http, job, spec)
                if spec.id != dropped:
                    emit(_record(spec, body, {"accuracy": 1.0}))
