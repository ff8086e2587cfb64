"""The HTTP calls reference targets make, written the way rollout code writes them."""

from __future__ import annotations

from typing import Any

import aiohttp

from bench.records.attribution import TRAJECTORY_HEADER
from bench.records.sample import SampleRecord

from .base import TrajectorySpec


async def generate(http: aiohttp.ClientSession, base_url: str, spec: TrajectorySpec, input_ids: list[int],
                   sampling_params: dict[str, Any]) -> dict[str, Any]:
    """POST /generate as slime and miles do (input ids, logprobs on); raises on an HTTP error.

    Reference targets name their trajectory in a header so the bench's identification (and
    thus every fault decision) is exact whatever the concurrency.
    """
    body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True}
    async with http.post(f"{base_url}/generate", json=body, headers={TRAJECTORY_HEADER: spec.id}) as reply:
        reply.raise_for_status()
        return await reply.json()


def output_of(body: dict[str, Any]) -> tuple[list[int], list[float] | None, str, str]:
    """(ids, logprobs, text, finish type) the way slime reads an answer: ids from the logprob triples."""
    meta = body["meta_info"]
    triples = meta.get("output_token_logprobs")
    if triples is None:
        return list(body.get("output_ids", [])), None, body["text"], meta["finish_reason"]["type"]
    return [t[1] for t in triples], [t[0] for t in triples], body["text"], meta["finish_reason"]["type"]


OUTCOME_OF_FINISH = {"stop": "completed", "length": "truncated", "abort": "aborted"}  # anything else: failed


def sample_of(spec: TrajectorySpec, body: dict[str, Any]) -> SampleRecord:
    """The record of a one-turn trajectory answered by `body` (the step reference targets' shared reading)."""
    ids, logprobs, _, finish = output_of(body)
    meta = body["meta_info"]
    return SampleRecord(trajectory=spec.id, group=spec.group, outcome=OUTCOME_OF_FINISH.get(finish, "failed"),
                        status=finish.upper(), prompt_length=len(spec.prompt_ids), response_ids=ids,
                        logprobs=logprobs, loss_mask=[1] * len(ids), response_length=len(ids), reward=1.0,
                        weight_versions=[str(meta.get("weight_version"))], attempt=1,
                        request_ids=[str(meta["id"])] if meta.get("id") else [])
