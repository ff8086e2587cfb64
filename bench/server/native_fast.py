"""The fast path of `POST /generate`: one plain request, answered from a reply precomputed as bytes.

A run (and the throughput benchmark) sends mostly one shape of request: one prompt as token ids, no stream, no
`X-Bench-Fault` header, identified as a recorded turn, no fault firing. Its answer is the same bytes every time but
for four fields (`id`, `weight_version`, `e2e_latency`, `response_sent_to_client_ts`), so the reply to each
(trajectory, turn, sampling parameters, logprob options) is built once, by the slow path's own formatter, with
sentinels where those fields go, and later requests splice their values into the saved pieces: no logprob triples,
no dict, no JSON encoding per request.

`accept` says whether a decoded body is of that shape (anything else returns None and takes the slow path, whose
checks and answers are SGLang's); the handler (`native.generate`) still logs, identifies, decides faults, registers
the request in flight and paces it exactly as the slow path does, and falls back to it when a fault fires, the
request does not match a recorded turn, or the recording answers with an error.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from bench.records.served_tokens import PackedAnswer, context_hash
from bench.replay import GenerateParams, Generation, Identity, pack
from bench.tokenizer import ByteBPETokenizer

from . import transport
from .native_format import NativeFormatter
from .native_request import NativeItem, NativeRequest, Rejected, ValueRejected, check_sampling, sampling_params
from .profiles import SglangProfile
from .wire import fresh_id

_encode = msgspec.json.Encoder().encode



_NULL = msgspec.Raw(b"null")


class _Plain(msgspec.Struct, forbid_unknown_fields=True):
    """The keys a plain body may hold, with the types SGLang's schema takes (ints are never bools here): a body
    with any other key (text, input_embeds, lora_path, ...) or another type does not decode, and takes the slow
    path, which checks and answers it as SGLang does."""

    input_ids: list[int]
    sampling_params: msgspec.Raw = _NULL  # kept as sent (any JSON value): its bytes name it (`SamplingCache`)
    return_logprob: Union[bool, None] = None
    stream: Union[bool, None] = None
    rid: Union[str, None] = None
    logprob_start_len: Union[int, None] = None
    top_logprobs_num: Union[int, None] = None
    return_text_in_logprobs: Union[bool, None] = None
    return_prompt_token_ids: Union[bool, None] = None


_plain_decoders: dict[int, tuple[Any, Any]] = {}  # vocabulary size -> decoders of `_Plain`, and of its ids alone


def _decoder_for(vocab_size: int) -> Any:
    """`_Plain`'s decoder with the ids' range checked while decoding (in C, instead of a `max` and a `min` after)."""
    return _decoders_for(vocab_size)[0]


def _decoders_for(vocab_size: int) -> tuple[Any, Any]:
    """`_Plain`'s decoder, and a decoder of an `input_ids` array alone, with the same range check."""
    decoders = _plain_decoders.get(vocab_size)
    if decoders is None:
        in_vocabulary = Annotated[int, msgspec.Meta(ge=0, lt=vocab_size)]
        checked = msgspec.defstruct("_PlainInVocabulary", [("input_ids", list[in_vocabulary])], bases=(_Plain,),
                                    forbid_unknown_fields=True)
        decoders = _plain_decoders[vocab_size] = (msgspec.json.Decoder(checked).decode,
                                                  msgspec.json.Decoder(list[in_vocabulary]).decode)
    return decoders


_OPENINGS = (b'{"input_ids": [', b'{"input_ids":[')  # Python's `json.dumps` (aiohttp's `json=`), and compact
_COMMA = ord(",")


_INPUT_IDS_KEY = b'"input_ids"'


class PromptCache:
    """The latest `input_ids` each trajectory sent (named by its `X-Bench-Trajectory` header), as the array's bytes,
    its ids and their packing: a multi-turn rollout sends its whole context every turn (1,640 ids on average in
    agentic-500), each time the previous one's followed by what came since, and a retry sends it again. So only the
    ids after a previous request's bytes are decoded and packed; the rest of the body is decoded on its own.

    Exact, never stale: a request's ids are taken from the cache only where its bytes are the cached bytes (a memcmp),
    the first byte after them a comma and the new ids a valid array of their own; the rest of the body is decoded as
    the body with an empty array in that place, so every key, type and range is checked as the whole body's decoder
    checks it. Anything else (another layout, a body that starts with another key) returns None: the whole body is
    decoded as before."""

    LIMIT = 512  # trajectories remembered (cleared when full: a run has a few hundred in flight)
    LIMIT_BYTES = 64 * 2**20  # and what they hold, reckoned (`_size`): long contexts make large entries

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, list[int], bytes]] = {}
        self.bytes = 0
        self.hits = 0  # requests whose ids were all, or all but the new ones, taken from the cache

    def parse(self, raw: bytes, hint: str, vocab_size: int) -> tuple[Any, list[int], bytes] | None:
        """(the body decoded with an empty `input_ids`, the ids, the ids packed), or None (decode it whole)."""
        for opening in _OPENINGS:
            if raw.startswith(opening):
                break
        else:
            return None
        start = len(opening) - 1  # the array's '['
        close = raw.find(b"]", start)  # its end, once what is before it decodes as ids (no string or nested array)
        if close < 0:
            return None
        text = raw[start:close]
        if _INPUT_IDS_KEY in raw[close:]:  # a second `input_ids` key (the last counts, even empty): decode it whole
            return None
        decode_body, decode_ids = _decoders_for(vocab_size)
        ids: list[int] | None = None
        packed, reused = b"", True
        last = self._last.get(hint)
        try:
            if last is not None:
                seen, seen_ids, seen_packed = last
                if text == seen:
                    ids, packed = seen_ids, seen_packed
                elif len(text) > len(seen) and text[len(seen)] == _COMMA and text.startswith(seen):
                    tail = decode_ids(b"[" + text[len(seen) + 1:] + b"]")
                    if not tail:  # `[1, 2,]`: not JSON (the whole body's decoder refuses it)
                        return None
                    ids, packed = seen_ids + tail, seen_packed + pack(tail)
            if ids is None:
                reused = False
                ids = decode_ids(text + b"]")
                packed = pack(ids)
            body = decode_body(opening + b"]" + raw[close + 1:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if body.input_ids or not ids:  # a second `input_ids` key written otherwise, or none sent: decode it whole
            return None
        self.hits += reused
        if last is not None:
            self.bytes -= _size(last[0], last[2])
            del self._last[hint]
        size = _size(text, packed)
        if size > self.LIMIT_BYTES:  # one prompt past the whole budget: not kept
            return body, ids, packed
        if len(self._last) >= self.LIMIT or self.bytes + size > self.LIMIT_BYTES:
            self._last.clear()
            self.bytes = 0
        self._last[hint] = (text, ids, packed)
        self.bytes += size
        return body, ids, packed


def _size(text: bytes, packed: bytes) -> int:
    """An entry's memory, reckoned: its bytes, and per id 4 packed, a list slot of 8 and an int of 28."""
    return len(text) + len(packed) // 4 * 40


_KEY_LIMIT = 4096  # bytes of sampling parameters a saved reply may be keyed on

# where the per-request values go in a saved reply; a body holding one of these strings itself is not saved
RID, VERSION, E2E, SENT_TS = "\x00bench-rid\x00", "\x00bench-version\x00", "\x00bench-e2e\x00", "\x00bench-ts\x00"
_SLOTS = (RID, VERSION, E2E, SENT_TS)
_SLOT_BYTES = tuple(_encode(s) for s in _SLOTS)


@dataclass(slots=True)
class FastRequest:
    """A plain `/generate` body, parsed (what `parse_generate` makes of it, as one item)."""

    ids: list[int]
    rid: str
    hint: str | None
    sampling: dict[str, Any]
    params: GenerateParams
    shape: tuple[Any, ...]  # what the reply's form depends on besides the generation: the logprob options
    key: bytes  # the sampling parameters as sent (encoded): with the turn and `shape`, names the reply
    packed: bytes  # `ids` as packed int32 (`bench.replay.pack`)
    parsed: NativeRequest | None = None  # built only when the slow path or a new reply needs it


class SamplingCache:
    """Sampling parameters already checked, by their bytes as sent: a run sends a handful of distinct ones. Keyed
    by the bytes alone (the checks do not depend on the prompt): each prompt of a multi-turn run has its own length,
    so keying on it too made every request check its parameters again."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._params: dict[bytes, tuple[dict[str, Any], GenerateParams] | None] = {}

    def params(self, key: bytes, input_len: int, profile: SglangProfile
               ) -> tuple[dict[str, Any], GenerateParams] | None:
        """The parameters (decoded) and the request's GenerateParams, or None when they are not an object, SGLang
        would refuse them, or they ask for several samples (the slow path answers)."""
        try:
            found = self._params[key]
        except KeyError:
            found = self._checked(key, profile)
        if found is None:
            return None
        sampling, params = found
        if params.input_len != input_len:  # what `sampling_params(sampling, input_len)` makes, without redoing it
            params = GenerateParams(input_len, params.max_new_tokens, params.stop_token_ids, params.stop,
                                    params.ignore_eos, params.no_stop_trim)
        return sampling, params

    def _checked(self, key: bytes, profile: SglangProfile) -> tuple[dict[str, Any], GenerateParams] | None:
        found: tuple[dict[str, Any], GenerateParams] | None = None
        sampling = msgspec.json.decode(key)
        if sampling is None:
            sampling = {}
        if isinstance(sampling, dict) and (sampling.get("n") or 1) == 1:  # n > 1 is a batch
            try:
                check_sampling(sampling, profile)
                found = (sampling, sampling_params(sampling, 0))
            except (Rejected, ValueRejected):
                pass
        if len(self._params) >= self.LIMIT:
            self._params.clear()
        self._params[key] = found
        return found


@dataclass(frozen=True, slots=True)
class _Parsed:
    """What `accept` makes of one body's bytes, less what each request has of its own (a made-up rid, its hint)."""

    ids: list[int]
    rid: str | None
    sampling: dict[str, Any]
    params: GenerateParams
    shape: tuple[Any, ...]
    key: bytes
    packed: bytes

    def request(self, hint: str | None) -> FastRequest:
        sent = self.rid
        return FastRequest(self.ids, fresh_id() if sent is None else sent, hint or sent, self.sampling, self.params,
                           self.shape, self.key, self.packed)


class BodyCache:
    """Bodies the fast path took, by their bytes: the samples of a group send their turn's prompt in the same bytes
    (each under its own trajectory header), and a retry sends it again, so only the first is decoded. Short bodies
    only (hashing a long one's bytes costs what decoding it does: those go to the prompt cache); cleared when
    full."""

    LIMIT = 4096  # bodies
    LIMIT_BYTES = 16 * 2**20  # what the bodies kept hold, reckoned as the prompt cache reckons it (`_size`)
    LONGEST = 16 * 2**10  # bytes of a body kept

    def __init__(self) -> None:
        self._parsed: dict[bytes, _Parsed] = {}
        self.bytes = 0
        self.hits = 0

    def get(self, raw: bytes) -> _Parsed | None:
        """The body taken before with these very bytes; None: not kept."""
        if len(raw) > self.LONGEST:
            return None
        return self._parsed.get(raw)

    def keep(self, raw: bytes, parsed: _Parsed) -> None:
        if len(raw) > self.LONGEST:
            return
        size = _size(raw, parsed.packed)  # the bytes, and the ids' list and packing (shared with the prompt cache)
        if len(self._parsed) >= self.LIMIT or self.bytes + size > self.LIMIT_BYTES:
            self._parsed.clear()
            self.bytes = 0
        self._parsed[raw] = parsed
        self.bytes += size


def accept(raw: bytes, hint: str | None, profile: SglangProfile, cache: SamplingCache,
           vocab_size: int, prompts: PromptCache | None = None, bodies: BodyCache | None = None
           ) -> FastRequest | None:
    """The body as a fast-path request, or None: anything but one prompt of token ids, not streamed, with valid
    sampling parameters, takes the slow path (which rejects, batches, streams, tokenizes as SGLang does). With
    `prompts`, a trajectory's ids already seen (its previous turn's, a retry's) are not decoded again; with `bodies`,
    a body whose bytes were taken before is not decoded at all."""
    if bodies is not None:
        known = bodies.get(raw)
        if known is not None:
            bodies.hits += 1
            return known.request(hint)
    parsed = _accept(raw, hint, profile, cache, vocab_size, prompts)
    if parsed is None:
        return None
    if bodies is not None:
        bodies.keep(raw, parsed)
    return parsed.request(hint)


def _accept(raw: bytes, hint: str | None, profile: SglangProfile, cache: SamplingCache,
            vocab_size: int, prompts: PromptCache | None) -> _Parsed | None:
    found_prompt = prompts.parse(raw, hint, vocab_size) if prompts is not None and hint is not None else None
    if found_prompt is not None:
        body, ids, packed = found_prompt
    else:
        try:  # ids outside the vocabulary do not decode: the slow path refuses them
            body = _decoder_for(vocab_size)(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        ids = body.input_ids
        if not ids:
            return None
        packed = b""
    if body.stream:
        return None
    if not packed:
        packed = pack(ids)  # needed for identifying it anyway (the decoder checked the range)
    key = bytes(body.sampling_params)
    if len(key) > _KEY_LIMIT:  # the caches key on these bytes: a large one takes the slow path, unsaved
        return None
    found = cache.params(key, len(ids), profile)
    if found is None:
        return None
    sampling, params = found
    start, top = body.logprob_start_len, body.top_logprobs_num
    shape = (bool(body.return_logprob), -1 if start is None else start, 0 if top is None else top,
             bool(body.return_text_in_logprobs), bool(body.return_prompt_token_ids))
    return _Parsed(ids, body.rid, sampling, params, shape, key, packed)


def native_request(fast: FastRequest) -> NativeRequest:
    """What `parse_generate` makes of the same body (with the fast path's rid): for the slow path and the formatter."""
    if fast.parsed is None:
        logprob, start, top, text, prompt_ids = fast.shape
        item = NativeItem(0, list(fast.ids), fast.rid, dict(fast.sampling), fast.params, fast.hint)
        fast.parsed = NativeRequest(items=[item], batch=False, stream=False, return_logprob=logprob,
                                    logprob_start_len=start, top_logprobs_num=top, return_text_in_logprobs=text,
                                    return_prompt_token_ids=prompt_ids)
    return fast.parsed


@dataclass(slots=True)
class Reply:
    """A recorded turn's answer to one request shape: the generation (less its identity) and the body as bytes,
    cut where the per-request values go."""

    generation: Generation  # a prototype: each request gets its own copy, with its identity
    served: PackedAnswer  # what the served-token store keeps of it
    finish: str | None  # the finish reason's type, as the request log keeps it
    instant: bool  # at the server's time scale there is nothing to wait for (`playback.played_at_once`)
    prompt_digest: bytes  # of the turn's prompt, as the served-token store digests it
    pieces: tuple[bytes, ...]  # len(order) + 1 pieces around the per-request values
    order: tuple[int, ...]  # which value goes after each piece: 0 rid, 1 weight version, 2 e2e latency, 3 sent ts
    size: int

    def body(self, rid: str, version: str, e2e: float) -> bytes:
        """The saved body with this request's values (the time it is sent, as the formatter takes it, last)."""
        values = (_encode(rid), _encode(version), _encode(round(e2e, 4)), _encode(round(time.time(), 4)))
        pieces, order = self.pieces, self.order
        if order == _USUAL:
            return b"".join((pieces[0], values[0], pieces[1], values[1], pieces[2], values[2], pieces[3], values[3],
                             pieces[4]))
        out = [pieces[0]]
        for position, slot in enumerate(order, 1):
            out.append(values[slot])
            out.append(pieces[position])
        return b"".join(out)

    def generation_for(self, identity: Identity) -> Generation:
        """The prototype with this request's identity; its token lists are shared (nothing edits them: a fault that
        would takes the slow path)."""
        return self.generation.with_identity(identity)


_USUAL = (0, 1, 2, 3)  # id, weight_version, e2e_latency, response_sent_to_client_ts: 0.5.6 and later


def make_reply(generation: Generation, profile: SglangProfile, tokenizer: ByteBPETokenizer,
               parsed: NativeRequest, prompt: bytes, time_scale: float) -> Reply | None:
    """The slow path's own body for `generation` (unfaulted), with sentinels in place of the per-request values;
    None when the body cannot be cut at them unambiguously (it then always takes the slow path)."""
    item = parsed.items[0]
    formatter = NativeFormatter(profile, tokenizer, parsed, VERSION, None)
    body = formatter.item(generation, RID, item.ids, e2e=0.0)
    meta = body["meta_info"]
    if "e2e_latency" in meta:
        meta["e2e_latency"] = E2E
    if "response_sent_to_client_ts" in meta:
        meta["response_sent_to_client_ts"] = SENT_TS
    encoded = transport.encode(body, None)
    found = []
    for slot, marker in enumerate(_SLOT_BYTES):
        count = encoded.count(marker)
        if count > 1:
            return None
        if count == 1:
            found.append((encoded.index(marker), slot, marker))
    if not any(slot == 0 for _, slot, _ in found):
        return None
    pieces, order = transport.cut_at(encoded, found)
    size = len(encoded) + 32 * len(generation.output_ids) + 256
    hashed = context_hash(prompt)  # the prompt hashed once: its digest, and the context's with the answer
    served = PackedAnswer.of(generation.output_ids, list(generation.logprobs or []) if parsed.return_logprob else None,
                             hashed)
    finish = (generation.finish_reason or {}).get("type")
    instant = transport.instant(generation.ttft, generation.total, time_scale)
    return Reply(generation, served, finish, instant, hashed.digest(), pieces, order, size)


class ReplyCache:
    """Saved replies, by (trajectory, turn, sampling parameters, request shape), up to `limit_bytes` (oldest out)."""

    def __init__(self, limit_bytes: int = 32 * 2**20) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self.hits = self.saved = 0  # replies answered from the cache, replies made and saved
        self._replies: OrderedDict[tuple[Any, ...], Reply | None] = OrderedDict()
        self.sampling = SamplingCache()
        self.prompts = PromptCache()
        self.bodies = BodyCache()

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, key: tuple[Any, ...]) -> Reply | None | bool:
        """The saved reply; None: that answer is never saved (the slow path answers); False: not made yet."""
        reply = self._replies.get(key, False)
        if reply:
            self.hits += 1
        return reply

    def peek(self, key: tuple[Any, ...]) -> Reply | None:
        """The saved reply, if one is (not counted as a hit: a faulted request looks before it knows it can use it)."""
        return self._replies.get(key) or None

    def put(self, key: tuple[Any, ...], reply: Reply | None) -> None:
        self._replies[key] = reply
        self.saved += reply is not None
        self.bytes += reply.size if reply is not None else 64
        while self.bytes > self.limit_bytes and len(self._replies) > 1:
            _, old = self._replies.popitem(last=False)
            self.bytes -= old.size if old is not None else 64
