"""Plug-in targets for the `provenance` invariant (issue 14), written as a user writes one: plain aiohttp, no
bench helpers, no trajectory header. Each completes its samples from valid replies; the buggy ones then hold
tokens or logprobs other than those served, the honest ones hold exactly what they were served, over every
route that returns token ids (`job.options["route"]`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench import Emit, RolloutJob, SampleRecord, TrajectorySpec

CHANGED, ZEROED, DOUBLED = "g00003-1", "g00007-0", "g00011-2"  # the three samples `Corrupts` alters
ROUTES = ("native", "native-stream", "completions", "chat", "vllm-generate")


@dataclass
class Reply:
    ids: list[int]
    logprobs: list[float | None] | None
    text: str
    finish: str


def _max_tokens(spec: TrajectorySpec) -> int:
    return int(spec.sampling_params.get("max_new_tokens", 256))


async def _native(http: aiohttp.ClientSession, url: str, spec: TrajectorySpec, ids: list[int],
                  stream: bool, ids_from_output_ids: bool = False) -> Reply:
    body = {"input_ids": ids, "sampling_params": spec.sampling_params, "return_logprob": True, "stream": stream}
    async with http.post(f"{url}/generate", json=body) as answer:
        answer.raise_for_status()
        if not stream:
            last = await answer.json()
        else:
            last = {}
            async for line in answer.content:
                text = line.decode().strip()
                if text.startswith("data: {"):
                    last = json.loads(text[len("data: "):])
    meta = last["meta_info"]
    triples = meta.get("output_token_logprobs")
    from_triples = triples is not None and not ids_from_output_ids
    ids_out = [t[1] for t in triples] if from_triples else list(last.get("output_ids", []))
    return Reply(ids_out, [t[0] for t in triples] if triples is not None else None, last["text"],
                 meta["finish_reason"]["type"])


async def _openai(http: aiohttp.ClientSession, url: str, spec: TrajectorySpec, ids: list[int], route: str) -> Reply:
    if route == "completions":
        body: dict[str, Any] = {"model": "m", "prompt": ids, "max_tokens": _max_tokens(spec), "logprobs": 0,
                                "return_token_ids": True}
        path = "/v1/completions"
    elif route == "vllm-generate":
        body, path = {"token_ids": ids, "sampling_params": {"max_tokens": _max_tokens(spec), "logprobs": 0}}, \
            "/inference/v1/generate"
    else:
        raise ValueError(route)
    async with http.post(url + path, json=body) as answer:
        answer.raise_for_status()
        choice = (await answer.json())["choices"][0]
    logprobs = choice.get("logprobs")
    if route == "completions":
        values = logprobs["token_logprobs"] if logprobs else None
    else:
        values = [entry[0]["logprob"] if isinstance(entry, list) else entry["logprob"]
                  for entry in logprobs["content"]] if logprobs else None
    return Reply(list(choice["token_ids"]), values, choice.get("text", ""), choice["finish_reason"])


async def _chat(http: aiohttp.ClientSession, url: str, spec: TrajectorySpec) -> Reply:
    body = {"model": "m", "messages": spec.messages, "max_tokens": _max_tokens(spec), "logprobs": True,
            "return_token_ids": True}
    async with http.post(url + "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        choice = (await answer.json())["choices"][0]
    logprobs = choice.get("logprobs")
    values = [entry["logprob"] for entry in logprobs["content"]] if logprobs else None
    return Reply(list(choice["token_ids"]), values, choice["message"].get("content") or "", choice["finish_reason"])


async def ask(http: aiohttp.ClientSession, job: RolloutJob, spec: TrajectorySpec, ids: list[int] | None = None
              ) -> Reply:
    """One generation over `job.options["route"]` (native by default: ids from the logprob triples, as slime
    reads them; `native-output-ids`: ids from `output_ids`, logprobs from the triples)."""
    route = job.options.get("route", "native")
    ids = spec.prompt_ids if ids is None else ids
    if route in ("native", "native-stream", "native-output-ids"):
        return await _native(http, job.base_url, spec, ids, route == "native-stream", route == "native-output-ids")
    if route == "chat":
        return await _chat(http, job.base_url, spec)
    return await _openai(http, job.base_url, spec, ids, route)


def record(spec: TrajectorySpec, reply: Reply) -> SampleRecord:
    outcome = {"length": "truncated", "abort": "aborted"}.get(reply.finish, "completed")
    return SampleRecord(spec.id, spec.group, outcome, status=reply.finish, prompt_length=len(spec.prompt_ids),
                        response_ids=list(reply.ids), logprobs=None if reply.logprobs is None else list(reply.logprobs),
                        loss_mask=[1] * len(reply.ids), response_length=len(reply.ids), reward=1.0)


class _Single:
    """One request per trajectory, all at once; `alter` is where a bug goes."""

    name = "provenance:honest"
    fail_fast = False

    def alter(self, spec: TrajectorySpec, sample: SampleRecord) -> None:
        pass

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:

            async def one(spec: TrajectorySpec) -> None:
                async with limit:
                    reply = await ask(http, job, spec)
                sample = record(spec, reply)
                self.alter(spec, sample)
                emit(sample)

            await asyncio.gather(*(one(spec) for spec in job.trajectories))


class Honest(_Single):
    """Keeps exactly what it was served."""


class Corrupts(_Single):
    """Completes every sample, then alters three after their valid replies: one token changed, the logprobs
    replaced by zeros, the served tokens appended twice (the issue's own user test)."""

    name = "provenance:corrupts"

    def alter(self, spec: TrajectorySpec, sample: SampleRecord) -> None:
        if spec.id == CHANGED:
            sample.response_ids[len(sample.response_ids) // 2] += 1
        elif spec.id == ZEROED:
            sample.logprobs = [0.0] * len(sample.response_ids)
        elif spec.id == DOUBLED:
            sample.response_ids += sample.response_ids
            sample.loss_mask += sample.loss_mask
            sample.logprobs = (sample.logprobs or []) * 2
            sample.response_length *= 2


class Float32Logprobs(_Single):
    """Honest, but keeps logprobs as float32 (as a torch tensor would): within provenance's tolerance."""

    name = "provenance:float32"

    def alter(self, spec: TrajectorySpec, sample: SampleRecord) -> None:
        import struct

        if sample.logprobs is not None:
            sample.logprobs = [None if v is None else struct.unpack("f", struct.pack("f", v))[0]
                               for v in sample.logprobs]


class FillsMissingLogprobs(_Single):
    """A reply without logprobs, or with a null one, is papered over with zeros."""

    name = "provenance:fills-missing-logprobs"

    def alter(self, spec: TrajectorySpec, sample: SampleRecord) -> None:
        if sample.logprobs is None:
            sample.logprobs = [0.0] * len(sample.response_ids)
        sample.logprobs = [0.0 if value is None else value for value in sample.logprobs]


class SwapsWithNeighbour:
    """Hands trajectory A's tokens to trajectory B (a batching bug that mixes up results)."""

    name = "provenance:swaps"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            replies = [await ask(http, job, spec) for spec in job.trajectories]
        samples = [record(spec, reply) for spec, reply in zip(job.trajectories, replies)]
        first, second = samples[1], samples[5]
        first.response_ids, second.response_ids = second.response_ids, first.response_ids
        first.logprobs, second.logprobs = second.logprobs, first.logprobs
        first.loss_mask, second.loss_mask = second.loss_mask, first.loss_mask
        first.response_length, second.response_length = len(first.response_ids), len(second.response_ids)
        for sample in samples:
            emit(sample)


class KeepsAbortedAttempt:
    """Resends a trajectory whose reply was aborted and, with `stale`, keeps the aborted attempt's tokens in
    front of the new ones (slime#1861's stale retry); `continue_partial` instead resumes generation from the
    partial output (a partial rollout, correct)."""

    name = "provenance:keeps-aborted"
    fail_fast = False

    def __init__(self, mode: str = "stale") -> None:
        self.mode = mode

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                reply = await ask(http, job, spec)
                ids, logprobs = list(reply.ids), list(reply.logprobs or [])
                while reply.finish == "abort":
                    if self.mode == "continue_partial":
                        reply = await ask(http, job, spec, spec.prompt_ids + ids)
                    else:
                        reply = await ask(http, job, spec)
                        if self.mode == "fresh":
                            ids, logprobs = [], []
                    ids, logprobs = ids + reply.ids, logprobs + list(reply.logprobs or [])
                final = Reply(ids, logprobs, reply.text, reply.finish)
                sample = record(spec, final)
                emit(sample)


def keeps_aborted_fresh() -> KeepsAbortedAttempt:
    return KeepsAbortedAttempt("fresh")


def keeps_aborted_partial() -> KeepsAbortedAttempt:
    return KeepsAbortedAttempt("continue_partial")


class ToolLoop:
    """Two turns: the reply, a tool message, a second reply. With `tool_mask=1` the tool output is counted as
    model tokens (loss mask 1), the bug; 0 is correct."""

    name = "provenance:tool-loop"
    fail_fast = False
    tool_mask = 0

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        from bench.tokenizer import ByteBPETokenizer

        tokenizer = ByteBPETokenizer.from_folder(job.tokenizer_path)
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                first = await ask(http, job, spec)
                tool = tokenizer.encode("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                                        "<|im_start|>assistant\n")
                second = await ask(http, job, spec, spec.prompt_ids + first.ids + tool)
                ids = first.ids + tool + second.ids
                sample = record(spec, Reply(ids, (first.logprobs or []) + [0.0] * len(tool) + (second.logprobs or []),
                                            second.text, second.finish))
                sample.loss_mask = [1] * len(first.ids) + [self.tool_mask] * len(tool) + [1] * len(second.ids)
                emit(self.shape(sample, len(first.ids), len(tool)))

    def shape(self, sample: SampleRecord, first: int, tool: int) -> SampleRecord:
        return sample


class MasksFirstTurn(ToolLoop):
    """Keeps the first reply in the sample but does not train on it (loss mask 0): sound, nothing unserved."""

    name = "provenance:masks-first-turn"

    def shape(self, sample: SampleRecord, first: int, tool: int) -> SampleRecord:
        sample.loss_mask[:first] = [0] * first
        return sample


class LosesSecondTurn(ToolLoop):
    """Trains on the first reply and drops the second from the sample: served, then lost."""

    name = "provenance:loses-second-turn"

    def shape(self, sample: SampleRecord, first: int, tool: int) -> SampleRecord:
        keep = first + tool
        sample.response_ids, sample.loss_mask = sample.response_ids[:keep], sample.loss_mask[:keep]
        sample.logprobs = (sample.logprobs or [])[:keep]
        sample.response_length = keep
        return sample


class ToolCountedAsModel(ToolLoop):
    name = "provenance:tool-as-model"
    tool_mask = 1


class Retokenizes(_Single):
    """Keeps the reply's text and re-tokenises it, as a text-only framework does; declares it."""

    name = "provenance:retokenizes"
    tokens_source = "retokenized"
    drop_char = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        from bench.tokenizer import ByteBPETokenizer

        self.tokenizer = ByteBPETokenizer.from_folder(job.tokenizer_path)
        await super().run(job, emit)

    def alter(self, spec: TrajectorySpec, sample: SampleRecord) -> None:
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True)
        if self.drop_char and spec.id == CHANGED:
            text = text[:-1]
        ids = self.tokenizer.encode(text)
        sample.response_ids, sample.loss_mask, sample.logprobs = ids, [1] * len(ids), None
        sample.response_length = len(ids)


class RetokenizesLossy(Retokenizes):
    name = "provenance:retokenizes-lossy"
    drop_char = True


class BadTokensSource(Honest):
    name = "provenance:bad-source"
    tokens_source = "text"
