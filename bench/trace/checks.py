"""Semantic checks of trace records, beyond what the typed schema enforces.

Each check yields `(field, message)` pairs; field paths use the on-disk names
(`turns[2].response.logprobs[7]`) so a user can find the value in the file.
"""

from __future__ import annotations

import math
from typing import Iterator

from bench.tokenizer import ByteBPETokenizer

from .schema import SCHEMA_VERSION, Response, TraceHeader, Trajectory, Turn

Issue = tuple[str, str]

FINISH_TYPES = ("stop", "length", "abort")
INPUT_FORMS = ("input_ids", "input_ids_append", "text", "messages")


def check_header(header: TraceHeader) -> Iterator[Issue]:
    if header.schema_version < 1:
        yield "schema_version", f"must be at least 1, got {header.schema_version}"
    if header.context_length <= 0:
        yield "context_length", f"must be positive, got {header.context_length}"
    if header.tokenizer.vocab_size <= 0:
        yield "tokenizer.vocab_size", f"must be positive, got {header.tokenizer.vocab_size}"
    if not 0 <= header.tokenizer.eos_token_id < header.tokenizer.vocab_size:
        yield "tokenizer.eos_token_id", f"{header.tokenizer.eos_token_id} is outside the vocabulary"
    if header.source.kind not in ("synthetic", "recorded"):
        yield "source.kind", f"must be 'synthetic' or 'recorded', got {header.source.kind!r}"


def check_trajectory(trajectory: Trajectory, header: TraceHeader, *, id_ranges: bool = True) -> Iterator[Issue]:
    """Every issue of a trajectory. `id_ranges=False` leaves out the token ids' vocabulary ranges, for a caller that
    checks them in bulk itself (`TraceStore.load`, on the packed ids) and asks again in full when one is out."""
    if not trajectory.id:
        yield "id", "must not be empty"
    if not trajectory.group_id:
        yield "group_id", "must not be empty"
    if id_ranges:
        yield from _check_ids("prompt.ids", trajectory.prompt.ids, header.tokenizer.vocab_size)
    yield from _check_raw_prompt(trajectory)
    if not trajectory.turns:
        yield "turns", "a trajectory needs at least one turn"
    if trajectory.reward is not None and not math.isfinite(trajectory.reward):
        yield "reward", f"must be finite, got {trajectory.reward}"
    for index, turn in enumerate(trajectory.turns):
        yield from _check_turn(f"turns[{index}]", index, turn, header, id_ranges)
    yield from _check_prompt_tokens(trajectory)


def _check_raw_prompt(trajectory: Trajectory) -> Iterator[Issue]:
    """A raw prompt and its rendering are a pair: the framework's template wraps the raw prompt, so the
    rendered text must contain it verbatim (a raw prompt that is not in the text belongs to another rendering)."""
    raw = trajectory.prompt.raw
    if raw is None:
        return
    if not raw.strip():
        yield "prompt.raw", "must not be empty (leave it out when the framework receives the rendered prompt)"
    elif raw not in trajectory.prompt.text:
        yield ("prompt.raw", f"does not occur in prompt.text: the rendered prompt (ids/text) must be the framework's "
                             f"rendering of this raw prompt (raw starts {raw[:40]!r})")


def _check_ids(field: str, ids: list[int], vocab_size: int) -> Iterator[Issue]:
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):  # C loops: the common case
        return
    for position, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            yield f"{field}[{position}]", f"token id {token_id} is outside the vocabulary (0..{vocab_size - 1})"
            return


def _check_turn(field: str, index: int, turn: Turn, header: TraceHeader, id_ranges: bool = True) -> Iterator[Issue]:
    request = turn.request
    forms = [name for name in INPUT_FORMS if getattr(request, name) is not None]
    if len(forms) != 1:
        found = ", ".join(forms) or "none"
        yield f"{field}.request", f"needs exactly one of {', '.join(INPUT_FORMS)}; found {found}"
    for name in ("input_ids", "input_ids_append"):
        ids = getattr(request, name)
        if ids is not None and id_ranges:
            yield from _check_ids(f"{field}.request.{name}", ids, header.tokenizer.vocab_size)
    if not request.endpoint.startswith("/"):
        yield f"{field}.request.endpoint", f"must be a path starting with '/', got {request.endpoint!r}"
    yield from _check_response(f"{field}.response", turn.response, header, id_ranges)
    call_ids = [call.id for call in turn.tool_calls]
    if len(set(call_ids)) != len(call_ids):
        yield f"{field}.tool_calls", "tool call ids must be unique within a turn"
    for position, output in enumerate(turn.tool_outputs):
        where = f"{field}.tool_outputs[{position}]"
        if output.call_id not in call_ids:
            yield f"{where}.call_id", f"{output.call_id!r} names no tool call of this turn"
        actual = len(output.text.encode("utf-8"))
        if output.bytes != actual:
            yield f"{where}.bytes", f"says {output.bytes} but the text has {actual} UTF-8 bytes"
        if output.tokens < 0:
            yield f"{where}.tokens", f"must not be negative, got {output.tokens}"


def _check_response(field: str, response: Response, header: TraceHeader, id_ranges: bool = True) -> Iterator[Issue]:
    ids = response.output_ids
    if id_ranges:
        yield from _check_ids(f"{field}.output_ids", ids, header.tokenizer.vocab_size)
    if response.logprobs is not None:
        if len(response.logprobs) != len(ids):
            yield f"{field}.logprobs", f"has {len(response.logprobs)} entries for {len(ids)} output ids"
        values = response.logprobs
        if values and not (all(map(math.isfinite, values)) and max(values) <= 0):  # C loops: the common case
            for position, value in enumerate(values):
                if not math.isfinite(value) or value > 0:
                    yield f"{field}.logprobs[{position}]", f"must be finite and <= 0, got {value}"
                    break
    if response.error is None and response.completion_tokens != len(ids):
        yield f"{field}.completion_tokens", f"is {response.completion_tokens} but there are {len(ids)} output ids"
    if response.error is not None:
        if ids:
            yield f"{field}.output_ids", "an error response carries no output"
        if not 400 <= response.error.status <= 599:
            yield f"{field}.error.status", f"must be an HTTP error status, got {response.error.status}"
    elif response.finish_reason is None:
        yield f"{field}.finish_reason", "a completed response needs a finish reason"
    if response.finish_reason is not None:
        kind = response.finish_reason.get("type")
        if kind not in FINISH_TYPES:
            yield f"{field}.finish_reason.type", f"must be one of {', '.join(FINISH_TYPES)}, got {kind!r}"
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        if getattr(response, name) < 0:
            yield f"{field}.{name}", f"must not be negative, got {getattr(response, name)}"
    latency = response.latency
    if not (math.isfinite(latency.ttft) and latency.ttft >= 0):
        yield f"{field}.latency.ttft", f"must be a non-negative number of seconds, got {latency.ttft}"
    elif not (math.isfinite(latency.total) and latency.total >= latency.ttft):
        yield f"{field}.latency.total", f"must be at least ttft ({latency.ttft}), got {latency.total}"


def _check_prompt_tokens(trajectory: Trajectory) -> Iterator[Issue]:
    """`prompt_tokens` must count the request's input ids, where the input was ids."""
    for index, (turn, length) in enumerate(zip(trajectory.turns, trajectory.iter_request_input_lengths())):
        if turn.response.error is None and length is not None and turn.response.prompt_tokens != length:
            yield (
                f"turns[{index}].response.prompt_tokens",
                f"is {turn.response.prompt_tokens} but the request has {length} input ids",
            )


def check_tokenization(trajectory: Trajectory, tokenizer: ByteBPETokenizer) -> Iterator[Issue]:
    """For traces in the shipped tokenizer: every text is what its ids decode to."""
    if tokenizer.encode(trajectory.prompt.text) != trajectory.prompt.ids:
        yield "prompt.ids", "are not the tokenization of prompt.text"
    for index, turn in enumerate(trajectory.turns):
        response = turn.response
        ids = response.output_ids
        matched = (response.finish_reason or {}).get("matched")
        if ids and isinstance(matched, int) and ids[-1] == matched:
            ids = ids[:-1]  # the matched stop token is kept in ids, trimmed from text
        if tokenizer.decode(ids) != response.text:
            yield f"turns[{index}].response.text", "is not what output_ids decode to"
        for position, output in enumerate(turn.tool_outputs):
            counted = len(tokenizer.encode(output.text))
            if output.tokens != counted:
                yield (
                    f"turns[{index}].tool_outputs[{position}].tokens",
                    f"says {output.tokens} but the text is {counted} tokens",
                )


def check_schema_version(version: object) -> Issue | None:
    if not isinstance(version, int) or isinstance(version, bool):
        return "schema_version", f"must be an integer, got {version!r}"
    if version > SCHEMA_VERSION:
        return (
            "schema_version",
            f"trace schema version {version} is newer than this rollout-bench reads "
            f"(up to {SCHEMA_VERSION}); upgrade rollout-bench to read it",
        )
    return None
