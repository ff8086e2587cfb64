"""The answer to one identified request: the recording, adapted to what was asked.

Adaptation follows SGLang: the context-length check comes first, then stop tokens and stop
strings cut the output (a matched stop token stays in the ids, a stop string is trimmed from
the text unless `no_stop_trim`), then `max_new_tokens` cuts with a `length` finish. When no
recorded answer fits, a deterministic one is synthesized from the request's bytes.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from bench.tokenizer import ByteBPETokenizer

from .identify import Identity
from .store import RecordedTurn

_FILLER = ("the value is computed from the input and the result is returned to the caller so "
           "we check each step then write the answer").split()


@dataclass(frozen=True)
class GenerateParams:
    """The parts of a request that shape its answer, whatever API it came through."""

    input_len: int
    max_new_tokens: int | None
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False


@dataclass
class Generation:
    """What the model produced for one request, before any API formats it."""

    identity: Identity
    output_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int
    ttft: float
    total: float
    error_status: int | None = None
    error_message: str | None = None
    synthesized: bool = False
    notes: list[str] = field(default_factory=list)
    max_new_tokens: int | None = None  # what the request allowed: a fault's replacement output keeps to it too

    def with_identity(self, identity: Identity) -> "Generation":
        """This generation for another request (the fast paths' saved prototype): its token lists shared, since
        nothing edits them (a fault that would takes the slow path), its notes its own. Positional: it is per request."""
        return Generation(identity, self.output_ids, self.logprobs, self.text, self.finish_reason, self.prompt_tokens,
                          self.cached_tokens, self.ttft, self.total, self.error_status, self.error_message,
                          self.synthesized, [], self.max_new_tokens)

    @property
    def is_error(self) -> bool:
        return self.error_status is not None


def context_error(input_len: int, max_new_tokens: int, context_length: int, *, legacy: bool = False) -> str | None:
    """SGLang's context-length 400 message, or None when the request fits."""
    if input_len >= context_length:
        return (f"The input ({input_len} tokens) is longer than the model's context length "
                f"({context_length} tokens).")
    over = input_len + max_new_tokens >= context_length if legacy else input_len + max_new_tokens > context_length
    if over:
        return (f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                f"You requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
                f"the input messages or the completion to fit within the limit.")
    return None


def build_generation(
    identity: Identity,
    recorded: RecordedTurn | None,
    params: GenerateParams,
    tokenizer: ByteBPETokenizer,
    *,
    seed_bytes: bytes,
    default_max_new_tokens: int = 128,
) -> Generation:
    """The adapted recorded answer, or a synthesized one when there is none."""
    max_new = default_max_new_tokens if params.max_new_tokens is None else params.max_new_tokens
    if recorded is not None and recorded.error_status is not None:
        return Generation(identity, [], None, "", None, params.input_len, 0, recorded.ttft, recorded.total,
                          recorded.error_status, recorded.error_message)
    if recorded is not None:
        ids = list(recorded.output_ids)
        logprobs = None if recorded.logprobs is None else list(recorded.logprobs)
        text, finish = recorded.text, recorded.finish_reason
        cached, ttft, total = recorded.cached_tokens, recorded.ttft, recorded.total
        if identity.resume:  # a resumed abort: the rest of the recorded answer (its start is in the request)
            done = identity.resume
            total = ttft + (total - ttft) * (len(ids) - done) / len(ids)
            ids, logprobs = ids[done:], None if logprobs is None else logprobs[done:]
            text = tokenizer.decode(ids, skip_special_tokens=True)
        synthesized = False
    else:
        ids, logprobs, text = _synthesize(tokenizer, seed_bytes)
        finish = {"type": "stop", "matched": tokenizer.eos_token_id}
        cached, ttft, total = 0, 0.01, 0.01 + 0.005 * len(ids)
        synthesized = True
    generation = Generation(identity, ids, logprobs, text, finish, params.input_len, cached, ttft, total,
                            synthesized=synthesized, max_new_tokens=max_new)
    _apply_stops(generation, params, tokenizer)
    if len(generation.output_ids) > max_new:
        _cut(generation, max_new, tokenizer)
        generation.finish_reason = {"type": "length", "length": max_new}
    return generation


def _synthesize(tokenizer: ByteBPETokenizer, seed_bytes: bytes) -> tuple[list[int], list[float], str]:
    rng = random.Random(hashlib.blake2b(seed_bytes, digest_size=8).digest())
    text = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(4, 24))).capitalize() + "."
    ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
    logprobs = [-round(min(20.0, rng.lognormvariate(-2.5, 1.8)), 4) for _ in ids]
    return ids, logprobs, text


def _cut(generation: Generation, keep: int, tokenizer: ByteBPETokenizer) -> None:
    """Keep the first `keep` tokens; decode time shrinks in proportion."""
    before = len(generation.output_ids)
    if before:
        generation.total = generation.ttft + (generation.total - generation.ttft) * keep / before
    generation.output_ids = generation.output_ids[:keep]
    if generation.logprobs is not None:
        generation.logprobs = generation.logprobs[:keep]
    generation.text = tokenizer.decode(generation.output_ids, skip_special_tokens=True)


def _apply_stops(generation: Generation, params: GenerateParams, tokenizer: ByteBPETokenizer) -> None:
    ids = generation.output_ids
    stop_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids.add(tokenizer.eos_token_id)
    if not stop_ids.isdisjoint(ids[:-1]):  # looked for in C first: the usual answer has no early stop token
        for position, token in enumerate(ids[:-1]):
            if token in stop_ids:
                _cut(generation, position + 1, tokenizer)
                generation.finish_reason = {"type": "stop", "matched": token}
                return
    if params.stop:
        _apply_stop_strings(generation, params, tokenizer)


def _apply_stop_strings(generation: Generation, params: GenerateParams, tokenizer: ByteBPETokenizer) -> None:
    """Stop at the first token whose text completes a stop string."""
    decoded = b""
    for position, token in enumerate(generation.output_ids):
        if tokenizer.is_special(token):
            continue
        decoded += tokenizer.token_bytes(token)
        text = decoded.decode("utf-8", errors="replace")
        found = [(text.find(s), s) for s in params.stop if s and s in text]
        if found:
            at, matched = min(found)
            _cut(generation, position + 1, tokenizer)
            generation.text = text if params.no_stop_trim else text[:at]
            generation.finish_reason = {"type": "stop", "matched": matched}
            return
