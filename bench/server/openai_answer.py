"""A replayed generation as an OpenAI choice: visible text, finish reason, tool calls, logprobs.

Independent of the response shape: `openai_format` builds vLLM or SGLang bodies from these.
A choice also carries its fault `Exchange`, whose wire overrides (edited logprob entries,
omitted logprobs, token ids or finish reason) the formatter honours.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from bench.replay import Generation
from bench.tokenizer import ByteBPETokenizer
from faults import Exchange

from .openai_request import OpenAIRequest

SENTINEL = -9999.0  # vLLM's clamp for -inf and its default for a missing logprob
_TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class Settled:
    """What one choice shows the client (for a stream: what it will have shown at the end)."""

    ids: list[int]
    entries: list[tuple[float | None, int]]  # (logprob, token id) per logprob entry shown
    text: str  # message content / completion text
    finish: str | None  # the generation's: "stop" | "length" | "abort" | None
    matched: int | str | None = None  # the stop token or string, when finish is "stop"
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # [{"name", "arguments"}]
    faults: Exchange | None = None  # what faults changed about how the choice is written

    @property
    def hides_logprobs(self) -> bool:
        return self.faults is not None and self.faults.omit_logprobs

    @property
    def hides_token_ids(self) -> bool:
        return self.faults is not None and self.faults.omit_token_ids

    @property
    def hides_finish(self) -> bool:
        return self.faults is not None and self.faults.omit_finish_reason

    def finish_reason(self, flavor: str) -> str | None:
        """vLLM reports an absent finish as "stop"; SGLang passes it through."""
        if self.tool_calls and (flavor != "sglang" or self.finish == "stop"):
            return "tool_calls"
        if self.finish is None and flavor != "sglang":
            return "stop"
        return self.finish

    def stop_reason(self, eos_token_id: int) -> int | str | None:
        """vLLM's `stop_reason`: the stop string or non-EOS stop token, else None."""
        if self.finish != "stop" or self.matched == eos_token_id:
            return None
        return self.matched

    def matched_stop(self) -> int | str | None:
        """SGLang's `matched_stop`."""
        return self.matched if self.finish == "stop" and not self.tool_calls else None


def settle(generation: Generation, count: int, aborted: bool, request: OpenAIRequest,
           tokenizer: ByteBPETokenizer, faults: Exchange | None = None) -> Settled:
    """The first `count` tokens of `generation` as the client sees them."""
    ids = generation.output_ids[:count]
    entries = _entries(generation, count, faults)
    skip = request.sampling.skip_special_tokens
    if aborted:
        return Settled(ids, entries, tokenizer.decode(ids, skip_special_tokens=skip), "abort", faults=faults)
    reason = generation.finish_reason or {}
    finish = reason.get("type")
    matched = reason.get("matched") if finish == "stop" else None
    if isinstance(matched, str):
        text = generation.text  # already cut (or not, for include_stop_str_in_output) at the stop string
    else:
        visible = ids
        if matched is not None and ids and ids[-1] == matched and not request.sampling.keep_stop:
            visible = ids[:-1]  # the stop token is in the ids, not in the text
        text = tokenizer.decode(visible, skip_special_tokens=skip)
    settled = Settled(ids, entries, text, finish, matched, faults=faults)
    if request.parse_tools:
        parsed = parse_tool_calls(text)
        if parsed is not None:
            settled.text, settled.tool_calls = parsed
    return settled


def _entries(generation: Generation, count: int, faults: Exchange | None) -> list[tuple[float | None, int]]:
    """The logprob entries of the first `count` tokens: a fault's edited ones, else one per token.

    Edited entries need not match the ids (a length-mismatch fault); a whole answer shows them all.
    """
    if faults is not None and faults.logprob_entries is not None:
        edited = faults.logprob_entries
        return list(edited if count >= len(generation.output_ids) else edited[:count])
    ids = generation.output_ids[:count]
    logprobs: list[float | None] = list(generation.logprobs or [])[:count]
    logprobs += [None] * (len(ids) - len(logprobs))
    return list(zip(logprobs, ids))


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, str]]] | None:
    """`<tool_call>{json}</tool_call>` blocks as OpenAI function calls, like a hermes-style parser.

    The content is the text before the first block without the newline the chat template puts
    back in front of each call, so a client echoing the message re-renders the same tokens.
    Any unparsable block leaves the text as plain content (what the real parsers do).
    """
    start = text.find("<tool_call>")
    if start < 0:
        return None
    calls = []
    for block in _TOOL_BLOCK.findall(text):
        try:
            call = json.loads(block)
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append({"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)})
    if not calls:
        return None
    content = text[:start]
    return content.removesuffix("\n"), calls


def clamp(logprob: float | None) -> float:
    """vLLM's `max(logprob, -9999.0)`: -inf and a missing chat logprob become -9999.0.

    NaN passes through Python's `max` here as in vLLM (only a `nan_logprob` fault makes one).
    """
    return SENTINEL if logprob is None else max(logprob, SENTINEL)


def token_text(tokenizer: ByteBPETokenizer, token_id: int) -> str:
    """A token's own text as the servers decode it alone (a cut UTF-8 sequence becomes U+FFFD)."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


class Cursor:
    """How much of one streamed choice has been sent: tokens, characters, completion text offset."""

    def __init__(self, final: Settled, tokenizer: ByteBPETokenizer, skip_special_tokens: bool) -> None:
        self.final = final
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.tokens = 0
        self.chars = 0
        self._bytes = bytearray()

    def advance(self, count: int) -> tuple[list[int], list[tuple[float | None, int]], str]:
        """The ids, logprob entries and text delta from the last sent token up to `count`.

        The last token's chunk also carries any logprob entries beyond the ids (a fault's extras).
        """
        start, self.tokens = self.tokens, count
        for token in self.final.ids[start:count]:
            if not (self.skip and self.tokenizer.is_special(token)):
                self._bytes += self.tokenizer.token_bytes(token)
        if count >= len(self.final.ids):
            upto = len(self.final.text)
        else:  # never run ahead of the final text (a stop string or tool block is cut from it)
            shown = self._bytes.decode("utf-8", errors="replace").rstrip("\ufffd")
            upto = min(len(shown), len(self.final.text))
        delta = self.final.text[self.chars:upto] if upto > self.chars else ""
        self.chars = max(self.chars, upto)
        entries = self.final.entries[start:] if count >= len(self.final.ids) else self.final.entries[start:count]
        return self.final.ids[start:count], entries, delta


def usage(flavor: str, prompt_tokens: int, completion_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    """Usage in each server's field order; vLLM's stream usage chunk drops its nulls."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                            "completion_tokens": completion_tokens}
    if flavor == "sglang":
        return body | {"prompt_tokens_details": None, "reasoning_tokens": 0}
    return body if stream else body | {"prompt_tokens_details": None}
