"""What a fault can change about one answer: the generation, the wire shape, the transport.

The server builds an `Exchange` per generation, lets every fired fault edit it, then
formats and sends it. Faults never see the server; the server knows no fault by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: a target's worker imports the fault catalogue without the server's replay stack
    from bench.replay import Generation
    from bench.tokenizer import ByteBPETokenizer


_UNSEEDED = random.Random()


@dataclass
class Replacement:
    """A whole HTTP answer sent instead of the generation (error statuses, broken bodies)."""

    status: int
    body: bytes
    content_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Transport:
    """How the bytes travel."""

    delay: float = 0.0  # extra seconds before anything is sent
    first_token_delay: float = 0.0  # extra seconds before the first token
    stall: bool = False  # send nothing until the client gives up
    reset: bool = False  # drop the connection without an answer
    truncate_at: float | None = None  # share of the body sent before the connection drops
    cut_after_chunks: int | None = None  # stream: events sent before the stream ends
    done_after_cut: bool = False  # stream: a cut stream still ends with `data: [DONE]`
    until_version: int | None = None  # hold the answer until the server's weight version is this (`delay` at most)
    until_idle_s: float | None = None  # ... or until nothing else has generated for this long


@dataclass
class Exchange:
    api: str  # "native" or "openai"
    flavor: str  # "sglang" or "vllm": whose error shapes the route speaks
    endpoint: str
    stream: bool
    generation: Generation
    weight_version: str
    context_length: int
    tokenizer: ByteBPETokenizer
    tools: tuple[str, ...] = ()  # the tools the trajectory's prompt announces: the tool protocol its client speaks
    # seeded per (plan, rule, attempt) by the engine when a fault fires; the shared unseeded default spares
    # every unfaulted answer a `random.Random()` seeded from the OS (5% of the server's CPU)
    rng: random.Random = _UNSEEDED
    logprob_entries: list[tuple[float | None, int]] | None = None  # (logprob, id) pairs, when a fault edits them
    refusal_context: int | None = None  # answer a context-length 400 claiming this context length
    content_type: str | None = None  # send the answer under this content type instead
    corrupt_json: bool = False  # cut the JSON body (or one stream event) in the middle
    omit_logprobs: bool = False  # logprobs were requested but the answer carries none
    omit_weight_version: bool = False
    reported_weight_version: str | None = None  # report this instead of the server's version
    omit_token_ids: bool = False  # OpenAI: no vLLM token-id fields
    omit_finish_reason: bool = False  # stream: no event carries a finish reason
    allow_nan: bool = False  # serialize NaN as the bare `NaN` token
    queued_abort: bool = False  # aborted before prefill: the reduced body shape
    replacement: Replacement | None = None
    transport: Transport = field(default_factory=Transport)

    def preempted(self) -> bool:
        """The client will not see the generation: an error answer, a context refusal or a dropped connection."""
        transport = self.transport
        return (self.replacement is not None or self.refusal_context is not None
                or transport.reset and not (self.stream and transport.cut_after_chunks is not None))

    def refused_anyway(self) -> bool:
        """The server refuses this request by itself (the recording has an error here) and no fault answers instead."""
        return self.generation.is_error and self.replacement is None and self.refusal_context is None

    def entries(self) -> list[tuple[float | None, int]]:
        """The (logprob, id) pairs the answer will carry, materialized for editing."""
        if self.logprob_entries is None:
            logprobs = self.generation.logprobs or [0.0] * len(self.generation.output_ids)
            self.logprob_entries = list(zip(logprobs, self.generation.output_ids))
        return self.logprob_entries

    def set_output(self, ids: list[int], text: str, finish: dict | None) -> str:
        """Replace what the model said (ids, text, finish reason), with fresh logprobs. A model never says more
        than the request's `max_new_tokens`: a longer replacement is cut there, finish `length`, as an engine
        would stop it. Returns "" or, when it was cut, a note for the fault log."""
        limit = self.generation.max_new_tokens
        note = ""
        if limit is not None and len(ids) > limit:
            note = f" (cut at the request's max_new_tokens {limit} of {len(ids)} tokens)"
            ids, finish = ids[:limit], {"type": "length", "length": limit}
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.generation.output_ids = ids
        self.generation.text = text
        self.generation.finish_reason = finish
        self.generation.logprobs = [-round(0.05 + self.rng.random(), 4) for _ in ids]
        self.logprob_entries = None
        return note
