"""SGLang native response bodies, per version profile (WIRE.md 1.2-1.6)."""

from __future__ import annotations

import time
from itertools import repeat
from typing import Any

from bench.replay import Generation
from bench.tokenizer import ByteBPETokenizer
from faults.exchange import Exchange

from .native_request import NativeRequest
from .profiles import SglangProfile

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _triples(ids: list[int], logprobs: list[float | None], tokenizer: ByteBPETokenizer,
             with_text: bool) -> list[Any]:
    if with_text:
        return [[lp, i, tokenizer.decode([i])] for lp, i in zip(logprobs, ids)]
    # tuples zipped in C, not a Python list per token: the same JSON arrays, and far less garbage per answer
    return list(zip(logprobs, ids, repeat(None)))  # type: ignore[arg-type]


def _prompt_logprob(token: int) -> float:
    """A stand-in prompt logprob: traces record none, clients only need a finite number."""
    return -round(1.0 + (token % 17) / 8, 4)


class NativeFormatter:
    """Builds `/generate` items for one request under one profile."""

    def __init__(self, profile: SglangProfile, tokenizer: ByteBPETokenizer, request: NativeRequest,
                 weight_version: str, exchange: Exchange | None = None) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self.request = request
        self.weight_version = weight_version
        self.exchange = exchange  # fault overrides: omitted keys, edited logprobs, reported version

    def item(self, generation: Generation, rid: str, prompt_ids: list[int], *, upto: int | None = None,
             finish: dict[str, Any] | None | bool = True, e2e: float | None = None, first: bool = True,
             incremental_from: int = 0) -> dict[str, Any]:
        """One response item. `upto` cuts a stream chunk; `finish=True` uses the generation's own reason."""
        count = len(generation.output_ids) if upto is None else upto
        ids = generation.output_ids[incremental_from:count]
        if upto is None or count == len(generation.output_ids) and finish is True:
            text = generation.text
        else:
            text = self.tokenizer.decode(generation.output_ids[:count], skip_special_tokens=True)
        if incremental_from:
            text = text[len(self.tokenizer.decode(generation.output_ids[:incremental_from],
                                                  skip_special_tokens=True)):]
        reason = generation.finish_reason if finish is True else finish
        body: dict[str, Any] = {"text": text}
        if self.profile.output_ids:
            body["output_ids"] = ids
        body["meta_info"] = self._meta(generation, rid, prompt_ids, ids, incremental_from, count, reason, e2e, first)
        return body

    def _meta(self, generation: Generation, rid: str, prompt_ids: list[int], ids: list[int], start: int, count: int,
              reason: Any, e2e: float | None, first: bool) -> dict[str, Any]:
        profile, request = self.profile, self.request
        meta: dict[str, Any] = {"id": rid, "finish_reason": reason, "prompt_tokens": generation.prompt_tokens}
        exchange = self.exchange
        if profile.weight_version and not (exchange and exchange.omit_weight_version):
            meta["weight_version"] = self._version()
        if profile.retractions_key:
            meta[profile.retractions_key] = 0
        if request.return_logprob and not (exchange and exchange.omit_logprobs):
            meta["input_token_logprobs"] = self._input_logprobs(prompt_ids)
            if exchange is not None and exchange.logprob_entries is not None:
                end = None if count == len(generation.output_ids) else count
                pairs = exchange.logprob_entries[start:end]
                meta["output_token_logprobs"] = _triples([i for _, i in pairs], [lp for lp, _ in pairs],
                                                         self.tokenizer, request.return_text_in_logprobs)
            else:
                logprobs = generation.logprobs or []
                meta["output_token_logprobs"] = _triples(ids, logprobs[start:count], self.tokenizer,
                                                         request.return_text_in_logprobs)
            if profile.output_logprobs_length:
                meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
            if request.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [None for _ in meta["input_token_logprobs"]]
                meta["output_top_logprobs"] = [[t] for t in meta["output_token_logprobs"]]
        if profile.reasoning_tokens:
            meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = count
        meta["cached_tokens"] = generation.cached_tokens
        if profile.cached_details_and_dp_rank:
            meta["cached_tokens_details"] = None
            meta["dp_rank"] = 0
        if e2e is not None:
            meta["e2e_latency"] = round(e2e, 4)
        if profile.response_sent_ts and first:
            meta["response_sent_to_client_ts"] = round(time.time(), 4)
        return meta

    def _version(self) -> str:
        reported = self.exchange.reported_weight_version if self.exchange else None
        return reported or self.weight_version

    def _input_logprobs(self, prompt_ids: list[int]) -> list[list[Any]]:
        start = self.request.logprob_start_len
        if start < 0:
            return [[None, prompt_ids[-1], None]] if self.profile.legacy_input_logprobs and prompt_ids else []
        with_text = self.request.return_text_in_logprobs
        return [[None if i == 0 else _prompt_logprob(t), t, self.tokenizer.decode([t]) if with_text else None]
                for i, t in enumerate(prompt_ids) if i >= start]

    def queued_abort(self, rid: str, e2e: float) -> dict[str, Any]:
        """A request aborted before prefill: the reduced shape each version answers."""
        profile, logprobs = self.profile, self.request.return_logprob
        if profile.queued_abort == "before_prefill":
            return {"text": "", "meta_info": {"id": rid, "finish_reason": {"type": "abort",
                    "message": "Abort before prefill"}, "prompt_tokens": 0, "completion_tokens": 0}}
        reason = {"type": "abort", "message": "Abort in waiting queue"}
        meta: dict[str, Any] = {"id": rid, "finish_reason": reason}
        if profile.queued_abort == "waiting_queue":
            meta["weight_version"] = self._version()
            meta["e2e_latency"] = round(e2e, 4)
        if logprobs:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = []
            if profile.output_logprobs_length:
                meta["output_token_logprobs_length"] = 0
        meta["completion_tokens"] = 0
        if profile.queued_abort == "waiting_queue":
            meta["response_sent_to_client_ts"] = round(time.time(), 4)
        return {"text": "", "output_ids": [], "meta_info": meta}
