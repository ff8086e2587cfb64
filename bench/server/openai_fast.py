"""The fast path of `POST /v1/chat/completions`: one plain chat request, answered from a reply saved as bytes.

An RL stack asks for each turn with one shape of request: messages, logprobs, token ids, one choice, not streamed, no
`X-Bench-Fault` header. Its answer is the same bytes every time but for `id`, `created`, SGLang's
`metadata.weight_version` and the ids of any tool calls, so the slow path's own formatter builds the reply to each
(trajectory, turn, request body) once, with markers where those values go, and later requests splice theirs into the
saved pieces: no chat template, no logprob entries, no dict, no JSON encoding per request.

Two caches make the first answer cheap too. A body already seen is not parsed again (`ChatReplies.parse`: the chat
template, the BPE and every check are a function of its bytes); and each token's logprob entry is JSON made once
per token id (`EntryTemplates`: text, bytes, keys), with only the logprob itself encoded per answer, where building
one dict per token was most of a chat answer's CPU.

The handler (`openai_routes`) still identifies, decides faults, logs and plays the request as the slow path does,
and continues on the slow path when a fault fires, the request is not a recorded turn, or the turn is refused.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from bench.records.served_tokens import PackedAnswer, context_hash
from bench.replay import GenerateParams, Generation, Identity, pack
from bench.tokenizer import ByteBPETokenizer

from . import transport
from .openai_answer import SENTINEL, Settled, clamp, settle
from .openai_format import Entries, OpenAIFormatter, tool_call_id
from .openai_request import OpenAIRequest, decode_body, parse_chat

_encode = msgspec.json.Encoder().encode

# where the per-request values go in a saved reply; a reply holding one of these strings itself is not saved
RID, CREATED, VERSION, CONTENT = "\x00bench-id\x00", "\x00bench-created\x00", "\x00bench-version\x00", "\x00bench-lp\x00"
_TOOL = "\x00bench-tool-{}\x00"
_SLOTS = (RID, CREATED, VERSION)  # then one per tool call: slot 3 + its index
_ID_CREATED = (0, 1)
# two logprobs no recording holds: a token's entry is cut where the first shows, and checked with the second
_MARKS = (1.0000000000000002e300, 3.0000000000000004e300)


@dataclass(slots=True, eq=False)
class FastChat:
    """A chat body as the slow path parses it, and what the fast path needs of it again on every request (compared
    by identity: a saved reply is keyed on the parsed body it answers)."""

    parsed: OpenAIRequest
    ids: list[int]  # the rendered prompt's ids (read, never edited)
    packed: bytes  # the same as int32 bytes, as the identifier and the served-token store take them
    params: GenerateParams
    eligible: bool  # one choice, not streamed: the fast path answers it
    size: int  # bytes it holds, about: the body's and the prompt's ids twice (a list and packed)
    kept: bool = False  # in the cache of parsed bodies: a later request of the same bytes gets this one


class EntryTemplates:
    """Chat logprob entries as JSON, made once per token id for one form of entry (flavor, `tokens_as_ids`, top
    logprobs or not): each entry is its token's fixed bytes around the encoded logprob. A template is checked against
    the formatter's own entry for a second logprob before it is used; a token whose text holds the marker is built
    whole each time."""

    def __init__(self, formatter: OpenAIFormatter) -> None:
        self._entry = formatter._chat_entry
        self._vllm = formatter.vllm
        self._around: dict[int, tuple[bytes, ...] | None] = {}
        self._none: dict[int, bytes] = {}  # vLLM: a missing logprob is its own entry form (pydantic defaults)
        self._marks = tuple(_encode(mark) for mark in _MARKS)

    def content(self, entries: Entries) -> bytes:
        """The JSON array `chat_logprobs` would give as `content` for these (logprob, token id) entries."""
        logprobs = [lp for lp, _ in entries]
        tokens = [token for _, token in entries]
        around = self._around
        for token in set(tokens).difference(around):
            around[token] = self._template(token)
        pieces = [around[token] for token in tokens]
        if (self._vllm and None in logprobs) or None in pieces:  # a rarer form of entry in the answer
            return self._content_by_entry(entries)
        if self._vllm:  # `clamp`, inline: max(lp, SENTINEL) keeps lp unless SENTINEL is greater (NaN stays)
            logprobs = [SENTINEL if SENTINEL > lp else lp for lp in logprobs]
        encoded = _encode(logprobs)[1:-1].split(b",") if logprobs else []
        return b"[" + b",".join(map(bytes.join, encoded, pieces)) + b"]"

    def _content_by_entry(self, entries: Entries) -> bytes:
        """`content`, entry by entry: vLLM's entry for a missing logprob, a token whose text holds the marker."""
        parts = []
        for logprob, token in entries:
            if logprob is None and self._vllm:
                part = self._none.get(token)
                if part is None:
                    part = self._none[token] = _encode(self._entry(token, None))
                parts.append(part)
                continue
            pieces = self._around.get(token)
            value = _encode(clamp(logprob) if self._vllm else logprob)
            parts.append(_encode(self._entry(token, logprob)) if pieces is None else value.join(pieces))
        return b"[" + b",".join(parts) + b"]"

    def _template(self, token: int) -> tuple[bytes, ...] | None:
        first, second = (_encode(self._entry(token, mark)) for mark in _MARKS)
        pieces = tuple(first.split(self._marks[0]))
        return pieces if len(pieces) > 1 and self._marks[1].join(pieces) == second else None


class _MarkedFormatter(OpenAIFormatter):
    """The slow path's formatter with markers in place of the per-request values, and the logprob content left to
    `EntryTemplates`."""

    def __init__(self, flavor: str, request: OpenAIRequest, tokenizer: ByteBPETokenizer, model: str) -> None:
        super().__init__(flavor, request, tokenizer, model, RID)
        self.created = CREATED  # type: ignore[assignment]  # a marker, spliced as the int it stands for
        self.tool_calls = 0

    def chat_logprobs(self, entries: Entries, settled: Settled) -> dict[str, Any] | None:
        return {"content": CONTENT} if self._shows_logprobs(settled) else None

    def _tool_call_id(self) -> str:
        self.tool_calls += 1
        return _TOOL.format(self.tool_calls - 1)


@dataclass(slots=True)
class ChatReply:
    """A recorded turn's answer to one chat body: the generation (less its identity) and the body as bytes, cut where
    the per-request values go."""

    generation: Generation  # a prototype: a paced request gets its own copy, with its identity
    served: PackedAnswer  # what the served-token store keeps of it
    finish: str | None  # the finish reason's type, as the request log keeps it
    instant: bool  # at the server's time scale there is nothing to wait for (`playback.played_at_once`)
    prompt_digest: bytes  # of the prompt, as the served-token store digests it
    pieces: tuple[bytes, ...]  # len(order) + 1 pieces around the per-request values
    order: tuple[int, ...]  # which value goes after each piece: 0 id, 1 created, 2 weight version, 3 + i tool call i
    vllm: bool
    size: int

    def body(self, response_id: str, version: str) -> bytes:
        """The saved body with this request's id, time (`created`, whole seconds), weight version and new tool call
        ids."""
        pieces, order = self.pieces, self.order
        if order == _ID_CREATED:  # vLLM without tool calls
            return b"".join((pieces[0], _encode(response_id), pieces[1], b"%d" % int(time.time()), pieces[2]))
        values = [_encode(response_id), b"%d" % int(time.time()), _encode(version)]
        out = [pieces[0]]
        for position, slot in enumerate(order, 1):
            out.append(values[slot] if slot < 3 else _encode(tool_call_id(self.vllm)))
            out.append(pieces[position])
        return b"".join(out)

    def generation_for(self, identity: Identity) -> Generation:
        """The prototype with this request's identity; its token lists are shared (nothing edits them: a fault that
        would takes the slow path)."""
        return self.generation.with_identity(identity)


class ChatReplies:
    """The chat fast path's caches: parsed bodies (by their bytes), entry templates, and saved replies by
    (trajectory, turn, parsed body), up to `limit_bytes` of replies (oldest out)."""

    PARSED_LIMIT = 1024  # bodies kept parsed
    PARSED_BYTES = 16 * 2**20  # and the bytes they hold at most (`FastChat.size`); a body over 1/64 of it is not kept

    def __init__(self, limit_bytes: int = 32 * 2**20) -> None:
        self.limit_bytes = limit_bytes
        self.parsed_limit_bytes = self.PARSED_BYTES
        self.bytes = 0
        self.hits = self.saved = 0  # replies answered from the cache, replies made and saved
        self._replies: OrderedDict[tuple[Any, ...], ChatReply | None] = OrderedDict()
        self._sizes: dict[tuple[Any, ...], int] = {}
        self._parsed: dict[bytes, FastChat] = {}
        self._parsed_bytes = 0
        self._templates: dict[tuple[Any, ...], EntryTemplates] = {}

    def __len__(self) -> int:
        return len(self._replies)

    def parse(self, raw: bytes, flavor: str, tokenizer: ByteBPETokenizer, context_length: int) -> FastChat:
        """The body as `parse_chat` makes it (raising its BadRequest), from the cache when these bytes were seen.
        Only bodies the fast path answers are kept: the slow path gets its own parse of the others."""
        found = self._parsed.get(raw)
        if found is not None:
            return found
        parsed = parse_chat(decode_body(raw), flavor, tokenizer)
        ids = parsed.prompts[0]
        eligible = not parsed.stream and parsed.sampling.n == 1
        fast = FastChat(parsed, ids, pack(ids), parsed.sampling.params(len(ids), context_length), eligible,
                        len(raw) + 12 * len(ids) + 512)
        if eligible and fast.size <= self.parsed_limit_bytes // 64:
            if len(self._parsed) >= self.PARSED_LIMIT or self._parsed_bytes + fast.size > self.parsed_limit_bytes:
                self._parsed.clear()
                self._parsed_bytes = 0
            self._parsed[raw] = fast
            self._parsed_bytes += fast.size
            fast.kept = True
        return fast

    def templates(self, formatter: OpenAIFormatter) -> EntryTemplates:
        request = formatter.request
        key = (formatter.flavor, formatter.tokenizer, request.tokens_as_ids, bool(request.top_logprobs))
        found = self._templates.get(key)
        if found is None:
            found = self._templates[key] = EntryTemplates(formatter)
        return found

    def get(self, key: tuple[Any, ...]) -> ChatReply | None | bool:
        """The saved reply; None: that answer is never saved (the slow path answers); False: not made yet."""
        reply = self._replies.get(key, False)
        if reply:
            self.hits += 1
        return reply

    def put(self, key: tuple[Any, ...], reply: ChatReply | None, held: int = 0) -> None:
        """Save a reply (None: never saved); `held`: the bytes its key keeps alive besides (the parsed body)."""
        size = (reply.size if reply is not None else 64) + held
        self._replies[key] = reply
        self._sizes[key] = size
        self.saved += reply is not None
        self.bytes += size
        while self.bytes > self.limit_bytes and len(self._replies) > 1:
            old, _ = self._replies.popitem(last=False)
            self.bytes -= self._sizes.pop(old)


def make_reply(generation: Generation, fast: FastChat, flavor: str, tokenizer: ByteBPETokenizer, model: str,
               time_scale: float, replies: ChatReplies) -> ChatReply | None:
    """The slow path's body for `generation` played whole and unfaulted, with markers in place of the per-request
    values; None when it cannot be cut at them unambiguously (it then always takes the slow path)."""
    parsed = fast.parsed
    settled = settle(generation, len(generation.output_ids), False, parsed, tokenizer)
    formatter = _MarkedFormatter(flavor, parsed, tokenizer, model)
    encoded = transport.encode(formatter.chat_body(fast.ids, [settled], VERSION), None)
    if formatter._shows_logprobs(settled):
        marker = _encode(CONTENT)
        if encoded.count(marker) != 1:
            return None
        encoded = encoded.replace(marker, replies.templates(formatter).content(settled.entries))
    found = []
    markers = [*_SLOTS, *(_TOOL.format(i) for i in range(formatter.tool_calls))]
    for slot, marker in enumerate(markers):
        marker_bytes = _encode(marker)
        count = encoded.count(marker_bytes)
        if count != (0 if slot == 2 and flavor != "sglang" else 1):  # vLLM's answers carry no weight version
            return None
        if count:
            found.append((encoded.index(marker_bytes), slot, marker_bytes))
    pieces, order = transport.cut_at(encoded, found)
    hashed = context_hash(fast.packed)  # the prompt hashed once: its digest, and the context's with the answer
    served = PackedAnswer.of(generation.output_ids, list(generation.logprobs or []) if parsed.logprobs else None,
                             hashed)
    finish = (generation.finish_reason or {}).get("type")
    instant = transport.instant(generation.ttft, generation.total, time_scale)
    size = len(encoded) + 32 * len(generation.output_ids) + 256
    return ChatReply(generation, served, finish, instant, hashed.digest(), pieces, order, flavor != "sglang", size)
