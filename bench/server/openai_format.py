"""OpenAI-compatible response bodies and stream chunks, per flavor (WIRE.md 3.1-3.3).

vLLM serializes non-stream bodies with every field (nulls kept) and stream chunks with the
fields it set (`exclude_unset`, so an explicitly passed None still shows as null); SGLang
keeps every field everywhere. Key order is each server's model field order.

Faults reach the bodies through each choice's `Settled`: edited logprob entries (possibly
not one per token), `logprobs: null`, no token-id keys at all (what SGLang sends), no finish
reason on a stream, and SGLang's `metadata.weight_version` dropped or reported stale.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from bench.tokenizer import ByteBPETokenizer

from .openai_answer import Cursor, Settled, clamp, token_text, usage
from .openai_request import OpenAIRequest

Entries = list[tuple[float | None, int]]  # (logprob, token id)


@lru_cache(maxsize=1 << 16)
def _token_piece(tokenizer: ByteBPETokenizer, token_id: int) -> tuple[str, tuple[int, ...]]:
    """A token's own text and its UTF-8 bytes, as chat logprob entries show them (a tuple: the same JSON array),
    decoded once: every answer repeats the same few thousand tokens, and decoding them per entry was most of a
    chat answer's CPU."""
    piece = token_text(tokenizer, token_id)
    return piece, tuple(piece.encode())


class OpenAIFormatter:
    """Builds one request's bodies and chunks; shared by every choice of the request."""

    def __init__(self, flavor: str, request: OpenAIRequest, tokenizer: ByteBPETokenizer, model: str,
                 response_id: str) -> None:
        self.flavor = flavor
        self.request = request
        self.tokenizer = tokenizer
        self.model = model
        self.id = response_id
        self.created = int(time.time())
        self.vllm = flavor != "sglang"

    # -- pieces ------------------------------------------------------------------------
    def _chat_entry(self, token_id: int, logprob: float | None) -> dict[str, Any]:
        piece, piece_bytes = _token_piece(self.tokenizer, token_id)
        if not self.vllm:
            top = [{"token": piece, "bytes": piece_bytes, "logprob": logprob}]
            return {"token": piece, "bytes": piece_bytes, "logprob": logprob,
                    "top_logprobs": top if self.request.top_logprobs else []}
        if self.request.tokens_as_ids:
            token = f"token_id:{token_id}"
            token_bytes: Sequence[int] = list(token.encode())
        else:
            token, token_bytes = piece, piece_bytes
        if logprob is None:  # vLLM: no sampled logprob -> the pydantic defaults
            return {"token": token, "logprob": clamp(None), "bytes": token_bytes, "top_logprobs": []}
        value = clamp(logprob)
        top = [{"token": token, "logprob": value, "bytes": token_bytes}]
        return {"token": token, "logprob": value, "bytes": piece_bytes,
                "top_logprobs": top if self.request.top_logprobs else []}

    def _shows_logprobs(self, settled: Settled) -> bool:
        return self.request.logprobs and not settled.hides_logprobs

    def chat_logprobs(self, entries: Entries, settled: Settled) -> dict[str, Any] | None:
        if not self._shows_logprobs(settled):
            return None
        return {"content": [self._chat_entry(t, lp) for lp, t in entries]}

    def completion_logprobs(self, entries: Entries, settled: Settled, offset: int = 0) -> dict[str, Any] | None:
        """`{text_offset, token_logprobs, tokens, top_logprobs}`; SGLang leaves offsets at -1.

        vLLM writes a missing completion logprob as null (its chat logprobs use -9999.0).
        """
        if not self._shows_logprobs(settled):
            return None
        logprobs = [lp for lp, _ in entries]
        tokens = [f"token_id:{t}" if self.vllm and self.request.tokens_as_ids else token_text(self.tokenizer, t)
                  for _, t in entries]
        if self.vllm:
            values = [None if lp is None else clamp(lp) for lp in logprobs]
            offsets = []
            for token in tokens:
                offsets.append(offset)
                offset += len(token)
            top: list[Any] = [None if v is None else {t: v} for t, v in zip(tokens, values)]
        else:
            values, offsets = list(logprobs), [-1] * len(tokens)
            top = [{t: v} for t, v in zip(tokens, values)] if self.request.top_logprobs else []
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": top}

    def generate_logprobs(self, entries: Entries, settled: Settled) -> dict[str, Any] | None:
        """`/inference/v1/generate`: tokens always `token_id:<id>`, no bytes."""
        if not self._shows_logprobs(settled):
            return None
        content = []
        for logprob, token_id in entries:
            token, value = f"token_id:{token_id}", clamp(logprob)
            top = [{"token": token, "logprob": value, "bytes": None}] if self.request.top_logprobs else []
            content.append({"token": token, "logprob": value, "bytes": None, "top_logprobs": top})
        return {"content": content}

    def _tool_calls(self, settled: Settled, delta: bool = False) -> list[dict[str, Any]]:
        calls = []
        for index, call in enumerate(settled.tool_calls):
            function = {"name": call["name"], "arguments": call["arguments"]}
            if self.vllm:
                entry: dict[str, Any] = {"id": self._tool_call_id(), "type": "function"}
                if delta:
                    entry["index"] = index
            else:
                entry = {"id": self._tool_call_id(), "index": index, "type": "function"}
            entry["function"] = function
            calls.append(entry)
        return calls

    def _tool_call_id(self) -> str:
        """A new tool call's id (random per answer, as the servers make them)."""
        return tool_call_id(self.vllm)

    def _envelope(self, kind: str, choices: list[Any]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _finish(self, settled: Settled, final: bool) -> str | None:
        """A stream chunk's finish reason: only on the last, and never under `stream_no_finish_reason`."""
        return settled.finish_reason(self.flavor) if final and not settled.hides_finish else None

    @staticmethod
    def _metadata(choices: list[Settled], weight_version: str) -> dict[str, Any]:
        """SGLang's `metadata`: the weight version, unless a fault dropped it or reports another."""
        faults = [s.faults for s in choices if s.faults is not None]
        if any(f.omit_weight_version for f in faults):
            return {}
        reported = next((f.reported_weight_version for f in faults if f.reported_weight_version), None)
        return {"weight_version": reported or weight_version}

    # -- non-stream bodies ---------------------------------------------------------------
    def chat_body(self, prompt_ids: list[int], choices: list[Settled], weight_version: str) -> dict[str, Any]:
        body = self._envelope("chat.completion", [self._chat_choice(i, s, prompt_ids) for i, s in enumerate(choices)])
        body["usage"] = usage(self.flavor, len(prompt_ids), sum(len(s.ids) for s in choices))
        if self.vllm:
            body["prompt_logprobs"] = None
            if not any(s.hides_token_ids for s in choices):
                body["prompt_token_ids"] = prompt_ids if self.request.return_token_ids else None
            return body | {"kv_transfer_params": None}
        return body | {"metadata": self._metadata(choices, weight_version)}

    def _chat_choice(self, index: int, settled: Settled, prompt_ids: list[int]) -> dict[str, Any]:
        """vLLM: `tool_calls` [] and token ids (null unless asked); SGLang: `matched_stop`, no ids by default."""
        content = settled.text if settled.text or not settled.tool_calls else None
        logprobs = self.chat_logprobs(settled.entries, settled)
        finish = settled.finish_reason(self.flavor)
        if self.vllm:
            message = {"role": "assistant", "content": content, "tool_calls": self._tool_calls(settled),
                       "reasoning": None}
            choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish,
                      "stop_reason": settled.stop_reason(self.tokenizer.eos_token_id)}
            if not settled.hides_token_ids:
                choice["token_ids"] = settled.ids if self.request.return_token_ids else None
            return choice
        message = {"role": "assistant", "content": content, "reasoning_content": None,
                   "tool_calls": self._tool_calls(settled) or None}
        choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish,
                  "matched_stop": settled.matched_stop()}
        if self.request.return_prompt_token_ids and not settled.hides_token_ids:
            choice["prompt_token_ids"] = prompt_ids
        return choice

    def completion_body(self, prompts: list[list[int]], choices: list[Settled], weight_version: str) -> dict[str, Any]:
        n, eos = self.request.sampling.n, self.tokenizer.eos_token_id
        built = []
        for index, settled in enumerate(choices):
            choice: dict[str, Any] = {"index": index, "text": settled.text,
                                      "logprobs": self.completion_logprobs(settled.entries, settled),
                                      "finish_reason": settled.finish_reason(self.flavor)}
            if self.vllm:
                wanted = self.request.return_token_ids
                choice |= {"stop_reason": settled.stop_reason(eos), "token_ids": settled.ids if wanted else None,
                           "prompt_logprobs": None, "prompt_token_ids": prompts[index // n] if wanted else None}
                if settled.hides_token_ids:
                    del choice["token_ids"], choice["prompt_token_ids"]
            else:
                choice["matched_stop"] = settled.matched_stop()
            built.append(choice)
        body = self._envelope("text_completion", built)
        body["usage"] = usage(self.flavor, sum(len(p) for p in prompts), sum(len(s.ids) for s in choices))
        if self.vllm:
            return body | {"kv_transfer_params": None}
        return body | {"metadata": self._metadata(choices, weight_version)}

    def generate_body(self, choices: list[Settled]) -> dict[str, Any]:
        built = []
        for index, settled in enumerate(choices):
            choice = {"index": index, "logprobs": self.generate_logprobs(settled.entries, settled),
                      "finish_reason": settled.finish_reason("vllm"), "token_ids": settled.ids}
            if settled.hides_token_ids:
                del choice["token_ids"]
            built.append(choice)
        return {"request_id": self.id, "choices": built, "prompt_logprobs": None, "kv_transfer_params": None}

    # -- stream chunks -------------------------------------------------------------------
    def cursor(self, final: Settled) -> Cursor:
        return Cursor(final, self.tokenizer, self.request.sampling.skip_special_tokens)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        if self.request.kind == "generate":
            return {"request_id": self.id, "choices": [],
                    "usage": usage("vllm", prompt_tokens, completion_tokens, stream=True)}
        kind = "chat.completion.chunk" if self.request.kind == "chat" else "text_completion"
        return self._envelope(kind, []) | {"usage": usage(self.flavor, prompt_tokens, completion_tokens, stream=True)}

    def role_chunks(self, prompt_ids: list[int], finals: list[Settled]) -> list[dict[str, Any]]:
        """Chat streams open each choice with the assistant role (vLLM adds `prompt_token_ids`)."""
        chunks = []
        for index in range(self.request.sampling.n):
            if self.vllm:
                choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}
                chunk = self._envelope("chat.completion.chunk", [choice])
                if not finals[index].hides_token_ids:
                    chunk["prompt_token_ids"] = prompt_ids if self.request.return_token_ids else None
                chunks.append(chunk)
            else:
                choice = {"index": index, "delta": _sglang_delta(role="assistant", content=""), "logprobs": None,
                          "finish_reason": None, "matched_stop": None}
                chunks.append(self._envelope("chat.completion.chunk", [choice]) | {"usage": None})
        return chunks

    def token_chunks(self, index: int, cursor: Cursor, count: int, prompt_ids: list[int]) -> list[dict[str, Any]]:
        """Chunks for the tokens up to `count`; the choice's last token also carries its finish."""
        first, offset = cursor.tokens == 0, cursor.chars
        ids, entries, text = cursor.advance(count)
        final = count >= len(cursor.final.ids)
        return self._chunks(index, cursor.final, ids, entries, text, final, first, prompt_ids, offset)

    def close_chunks(self, index: int, cursor: Cursor, ending: Settled, prompt_ids: list[int]) -> list[dict[str, Any]]:
        """The end of a choice that has no token left to carry it (aborted, or empty)."""
        entries = ending.entries[cursor.tokens:]  # a fault's extra entries beyond the (zero) tokens
        return self._chunks(index, ending, [], entries, None, True, cursor.tokens == 0, prompt_ids, cursor.chars)

    def _chunks(self, index: int, settled: Settled, ids: list[int], entries: Entries, text: str | None,
                final: bool, first: bool, prompt_ids: list[int], offset: int) -> list[dict[str, Any]]:
        if self.request.kind == "generate":
            return [self._generate_chunk(index, settled, ids, entries, final)]
        if self.request.kind == "completion":
            return [self._completion_chunk(index, settled, ids, entries, text, final, first, prompt_ids, offset)]
        if self.vllm:
            return self._vllm_chat_chunks(index, settled, ids, entries, text, final)
        return self._sglang_chat_chunks(index, settled, entries, text, final)

    def _generate_chunk(self, index: int, settled: Settled, ids: list[int], entries: Entries,
                        final: bool) -> dict[str, Any]:
        choice = {"index": index, "logprobs": self.generate_logprobs(entries, settled),
                  "finish_reason": self._finish(settled, final), "token_ids": ids}
        if settled.hides_token_ids:
            del choice["token_ids"]
        return {"request_id": self.id, "choices": [choice]}

    def _completion_chunk(self, index: int, settled: Settled, ids: list[int], entries: Entries,
                          text: str | None, final: bool, first: bool, prompt_ids: list[int],
                          offset: int) -> dict[str, Any]:
        """vLLM sets every field on every chunk (so its nulls show); prompt ids ride on a choice's first."""
        finish = self._finish(settled, final)
        choice = {"index": index, "text": text or "", "logprobs": self.completion_logprobs(entries, settled, offset),
                  "finish_reason": finish}
        if not self.vllm:
            choice["matched_stop"] = settled.matched_stop() if finish else None
            return self._envelope("text_completion", [choice]) | {"usage": None}
        wanted = self.request.return_token_ids
        choice["stop_reason"] = settled.stop_reason(self.tokenizer.eos_token_id) if finish else None
        if not settled.hides_token_ids:
            choice |= {"prompt_token_ids": prompt_ids if wanted and first else None,
                       "token_ids": ids if wanted else None}
        return self._envelope("text_completion", [choice])

    def _vllm_chat_chunks(self, index: int, settled: Settled, ids: list[int], entries: Entries,
                          text: str | None, final: bool) -> list[dict[str, Any]]:
        """The finish rides on the last token's chunk; `stop_reason` appears only there."""
        hidden = self.request.parse_tools and not text  # a tool parser holds back tool-call tokens
        if hidden and not final and not (self.request.logprobs or self.request.return_token_ids):
            return []
        delta: dict[str, Any] = {} if text is None or hidden else {"content": text}
        if final and settled.tool_calls:
            delta["tool_calls"] = self._tool_calls(settled, delta=True)
        finish = self._finish(settled, final)
        choice = {"index": index, "delta": delta, "logprobs": self.chat_logprobs(entries, settled),
                  "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = settled.stop_reason(self.tokenizer.eos_token_id)
        if not settled.hides_token_ids:
            choice["token_ids"] = ids if self.request.return_token_ids else None
        return [self._envelope("chat.completion.chunk", [choice])]

    def _sglang_chat_chunks(self, index: int, settled: Settled, entries: Entries, text: str | None,
                            final: bool) -> list[dict[str, Any]]:
        """SGLang sends content, then tool calls, then the finish, each in a chunk of its own."""
        deltas: list[tuple[dict[str, Any], Any]] = []
        if text is not None and not (self.request.parse_tools and not text):
            deltas.append((_sglang_delta(content=text), self.chat_logprobs(entries, settled)))
        if final and settled.tool_calls:
            deltas.append((_sglang_delta(tool_calls=self._tool_calls(settled)), None))
        chunks = [self._envelope("chat.completion.chunk", [{"index": index, "delta": delta, "logprobs": lp,
                                                            "finish_reason": None, "matched_stop": None}])
                  | {"usage": None} for delta, lp in deltas]
        if self._finish(settled, final) is not None:
            choice = {"index": index, "delta": _sglang_delta(), "logprobs": None,
                      "finish_reason": settled.finish_reason(self.flavor), "matched_stop": settled.matched_stop()}
            chunks.append(self._envelope("chat.completion.chunk", [choice]) | {"usage": None})
        return chunks


def tool_call_id(vllm: bool) -> str:
    """vLLM's `chatcmpl-tool-<32 hex>` or SGLang's `call_<24 hex>`."""
    return f"chatcmpl-tool-{secrets.token_hex(16)}" if vllm else f"call_{secrets.token_hex(12)}"


def _sglang_delta(role: str | None = None, content: str | None = None,
                  tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "reasoning_content": None, "tool_calls": tool_calls}
