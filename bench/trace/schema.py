"""Trace format v1: the typed records of a trace file.

A trace is JSON Lines (optionally gzip): one `TraceHeader` line, then one `Trajectory`
line per trajectory. Field order here is the order on disk. `traces/README.md` is the
human description of the same schema; keep the two in step.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgspec

SCHEMA_VERSION = 1


class _Record(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every record: unknown keys are errors (typos must not vanish silently)."""


class TraceSource(_Record):
    """Where the trace came from: a synthesizer run or a recording of a live server."""

    kind: str  # "synthetic" | "recorded"
    generator: str  # e.g. "rollout-bench synth 0.1.0" or "rollout-bench record"
    details: dict[str, Any] = {}


class TokenizerInfo(_Record):
    """The tokenizer the token ids belong to."""

    name: str
    vocab_size: int
    eos_token_id: int
    pad_token_id: int | None = None


class TraceHeader(_Record, tag="header", tag_field="type"):
    schema_version: int
    source: TraceSource
    model: str
    tokenizer: TokenizerInfo
    context_length: int
    created: str  # ISO 8601, UTC
    metadata: dict[str, Any] = {}


class Prompt(_Record):
    """The trajectory's prompt: as the dataset gave it (messages, tools) and as rendered.

    `raw` is set when the framework renders the prompt itself (its own template around the dataset's
    question, as slime's retool example does): `raw` is what the framework receives, `ids` (and `text`)
    what it sends. Replay identifies requests by `ids`; a target feeds the framework `raw`.
    """

    ids: list[int]
    text: str
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    raw: str | None = None


class Request(_Record):
    """One generate request as the client sent it.

    Exactly one input form: `input_ids` (the full prompt), `input_ids_append` (the ids this
    turn adds after the previous turn's output, or after the prompt on turn 0; keeps
    multi-turn traces linear in size), `text`, or `messages` (OpenAI chat routes).
    """

    endpoint: str
    sampling_params: dict[str, Any]
    input_ids: list[int] | None = None
    input_ids_append: list[int] | None = None
    text: str | None = None
    messages: list[dict[str, Any]] | None = None


class Latency(_Record):
    """Seconds from request to first token and to the complete response."""

    ttft: float
    total: float


class ResponseError(_Record):
    """An HTTP error answered instead of a completion (e.g. the context-length 400)."""

    status: int
    message: str


class Response(_Record):
    """What the server answered, in SGLang's terms.

    `output_ids` and `logprobs` include a matched stop token; `text` has it trimmed.
    `logprobs` is null when the server returned none.
    """

    output_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: dict[str, Any] | None
    weight_version: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency: Latency
    error: ResponseError | None = None


class ToolCall(_Record):
    id: str
    name: str
    arguments: str  # JSON text, as in the OpenAI tool-call format


class ToolOutput(_Record):
    """A tool's result, fed to the model in the next turn's request."""

    call_id: str
    text: str
    bytes: int
    tokens: int


class Turn(_Record):
    request: Request
    response: Response
    tool_calls: list[ToolCall] = []
    tool_outputs: list[ToolOutput] = []


class Trajectory(_Record, tag="trajectory", tag_field="type"):
    id: str
    group_id: str
    prompt: Prompt
    turns: list[Turn]
    reward: float | None = None
    metadata: dict[str, Any] = {}

    def request_input_ids(self, turn: int) -> list[int] | None:
        """The full input ids of turn `turn`'s request (None if it was sent as text or messages)."""
        for index, ids in enumerate(self.iter_request_input_ids()):
            if index == turn:
                return ids
        raise IndexError(f"trajectory {self.id!r} has no turn {turn}")

    def iter_request_input_ids(self) -> Iterator[list[int] | None]:
        """Each turn's full request input ids, rebuilding `input_ids_append` forms in one pass.

        A turn sent as text or messages yields None, and so does every later turn that
        only appends to it.
        """
        context: list[int] | None = list(self.prompt.ids)
        for step in self.turns:
            request = step.request
            if request.input_ids is not None:
                context = list(request.input_ids)
            elif request.input_ids_append is not None and context is not None:
                context.extend(request.input_ids_append)
            else:
                context = None
            yield None if context is None else list(context)
            if context is not None:
                context.extend(step.response.output_ids)


    def iter_request_input_lengths(self) -> Iterator[int | None]:
        """`len()` of each of `iter_request_input_ids()`'s items (None where it yields None), without building the
        lists: checking a long multi-turn trajectory must not copy its context once per turn."""
        length: int | None = len(self.prompt.ids)
        for step in self.turns:
            request = step.request
            if request.input_ids is not None:
                length = len(request.input_ids)
            elif request.input_ids_append is not None and length is not None:
                length += len(request.input_ids_append)
            else:
                length = None
            yield length
            if length is not None:
                length += len(step.response.output_ids)


class _HeaderProbe(msgspec.Struct):
    """Just enough of a header to refuse a newer schema before strict decoding."""

    schema_version: Any = None
    type: Any = None
