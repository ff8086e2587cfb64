"""Upstream mode: the bench server in front of a LIVE engine (`rollout-bench proxy`, `run --upstream`).

The generation comes from forwarding the client's request, unchanged, to the engine (SGLang's `/generate`,
streamed or not; an OpenAI-compatible `/v1/completions` or `/v1/chat/completions`) and parsing its answer
(`bench.capture.parse`); who sent it comes from the token stream (`bench.capture.tracker`: trajectory,
group, turn, attempt), and the plan decides before the engine is asked: a fault that answers in the
generation's place (an error status, the router's 503, a context refusal, a reset) spares the engine, as a
router that answers 503 never reaches one. From there everything is the mock's: the faults edit the answer,
the bench's formatters write it (native or OpenAI, streamed or not), the request log, the served tokens and
the fault log record it. So the fault catalogue, the deterministic schedules and the invariants built on
those logs work unchanged against a real engine.

Every generation answer is re-rendered, faulted or not (not forwarded byte for byte): one code path writes
both, so a client cannot tell a faulted answer by its formatting, and what the served-tokens log holds is
exactly what the client was sent. The price: fields of the engine's answer the bench's formatters do not
know are not passed on, and a stream is re-sent once the engine's answer is complete (its time to first
token is the engine's whole generation). The engine's own errors (any non-2xx answer, an in-band stream
error) and requests the bench's parser refuses are passed through byte for byte, unfaulted. Every other
route (`/health`, `/flush_cache`, `/get_model_info`, `/update_weights_*`, `/abort_request`,
`/pause_generation`, `/v1/models`, a router's `/workers` ...) is forwarded unchanged; only `/bench/*`
stays the bench's.

Re-rendering needs the model's tokenizer (texts of partial answers, logprob triples, the faults that write
text): `--tokenizer DIR` (a local Hugging Face tokenizer folder), or the bench's own when the upstream is the
bench's mock (how the tests run on CPU); `bench.server.proxy` picks it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from bench.capture.parse import CaptureError, CapturedAnswer, StreamAssembler, parse_answer, parse_request
from bench.capture.tracker import Placement, TrafficTracker, ids_key
from bench.replay import GenerateParams, Generation, Identity
from faults import Exchange

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# hop-by-hop headers, the bench's own controls and what aiohttp recomputes: never forwarded either way
_DROP_REQUEST = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding",
                 "x-bench-fault"}
_DROP_REPLY = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date",
               "server", "x-bench-served-trajectory", "x-bench-served-turn", "x-bench-served-attempt",
               "x-bench-served-request-id"}


@dataclass(frozen=True)
class Fetched:
    """The engine's answer to a forwarded request, as it came (with when each piece of the body came)."""

    status: int
    headers: dict[str, str]
    body: bytes
    started: float = 0.0  # time.monotonic() when the request went out
    pieces: tuple[tuple[bytes, float], ...] = ()  # the body as it arrived: (bytes, time.monotonic())

    @property
    def content_type(self) -> str:
        return next((v for k, v in self.headers.items() if k.lower() == "content-type"), "")


@dataclass
class _Open:
    placement: Placement
    generation: Generation | None = None
    without_logprobs: bool = False  # the engine's answer carried no logprobs (`keep_logprobs_missing`)


@dataclass
class Upstream:
    """The engine behind the proxy: one pooled HTTP session, the traffic tracker, the open placements."""

    url: str
    tracker: TrafficTracker
    # the tracker knows a trace's groups (`--trace`): a request it places outside them is none of the dataset's
    # trajectories (a client that re-rendered or altered its context), logged and decided as an unknown prompt
    named: bool = False
    _session: aiohttp.ClientSession | None = None
    _open: dict[Identity, _Open] = field(default_factory=dict)
    dispatched: frozenset[str] | None = None  # set by the runner (the mock's Identifier has it too)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
            self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=True,
                                                  connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, request: web.Request) -> Fetched:
        """Forward `request` (method, path, query, body, headers) to the engine; its whole answer."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        body = await request.read()
        started = time.monotonic()
        try:
            async with self.session().request(request.method, self.url + request.path_qs, data=body or None,
                                              headers=headers, allow_redirects=False) as reply:
                pieces = []
                async for piece in reply.content.iter_any():
                    pieces.append((piece, time.monotonic()))
                kept = {k: v for k, v in reply.headers.items() if k.lower() not in _DROP_REPLY}
                return Fetched(reply.status, kept, b"".join(p for p, _ in pieces), started, tuple(pieces))
        except aiohttp.ClientError as error:
            message = f"rollout-bench proxy: upstream {self.url} failed: {type(error).__name__}: {error}"
            return Fetched(502, {"Content-Type": "application/json"},
                           json.dumps({"error": {"message": message, "type": "upstream_error"}}).encode(), started)

    async def forward(self, request: web.Request) -> web.Response:
        """An admin route: the engine's answer, unchanged."""
        return self.pass_through(await self.fetch(request))

    @staticmethod
    def pass_through(fetched: Fetched) -> web.Response:
        response = web.Response(body=fetched.body, status=fetched.status)
        response.headers.popall("Content-Type", None)
        for key, value in fetched.headers.items():
            response.headers.add(key, value)
        return response

    def answers(self, path: str, request_body: bytes, fetched: Fetched, expected: int,
                tokenizer: Any) -> list[CapturedAnswer] | None:
        """The engine's answer as `expected` generations (native batch items, OpenAI choices, in order); None when
        it is not a complete generation answer (an error status, an in-band error, a body the bench cannot read,
        a count that does not match): then it is passed through unchanged. An answer that names no token ids
        (SGLang's OpenAI routes send text only) gets its text's ids in `tokenizer`."""
        if not 200 <= fetched.status < 300:
            return None
        try:
            captured = parse_request(path, request_body)
        except CaptureError:
            return None
        if captured.stream and "text/event-stream" in fetched.content_type:
            assembler = StreamAssembler(captured, fetched.started)
            for piece, at in fetched.pieces:
                assembler.feed(piece, at)
            answers = assembler.answers()
        else:
            answers = parse_answer(captured, fetched.status, fetched.body,
                                   (fetched.pieces[-1][1] if fetched.pieces else fetched.started) - fetched.started)
        if len(answers) != expected or any(a.error is not None for a in answers):
            return None
        for answer in answers:
            if not answer.ids_known:  # its logprobs, when not one per re-encoded id, are dropped by `generation`
                answer.output_ids = tokenizer.encode(answer.text)
        return answers

    def place(self, ids: list[int], hint: str | None) -> Identity:
        """Who sent these input ids: the tracker's placement, as the replay's Identity (attempts count from 1).
        A request naming its trajectory (`hint`: an `X-Bench-Trajectory` header, a `rid`) is placed there when it
        fits; otherwise identical turn-0 inputs of a group's members are told apart by arrival order (`by_order`),
        and a failed member's identical sibling may be taken for its retry: the fault decisions then depend on
        the order requests came in."""
        placement = self.tracker.place(ids_key(ids), hint)
        if self.named and not placement.known:  # as the mock names a request it cannot identify: `request:<id>`
            identity = Identity(None, None, placement.turn, placement.attempt + 1, drift="unknown_prompt",
                                digest=placement.trajectory)
        else:
            identity = Identity(placement.trajectory, placement.group, placement.turn, placement.attempt + 1,
                                by_order=placement.turn == 0 and placement.trajectory != hint)
        self._open[identity] = _Open(placement)
        return identity

    def index_of(self, identity: Identity) -> int | None:
        entry = self._open.get(identity)
        return entry.placement.index if entry is not None else None

    def generation(self, identity: Identity, answer: CapturedAnswer, params: GenerateParams,
                   eos_token_id: int) -> Generation:
        """The engine's answer as the Generation the fault plan edits and the formatters write."""
        ids = list(answer.output_ids)
        logprobs = None if answer.logprobs is None else list(answer.logprobs)  # a null the engine sent stays null
        if logprobs is not None and not answer.ids_known and len(logprobs) != len(ids):
            logprobs = None  # sent, but not one per id the text re-encodes to: shown as entries without a logprob
        generation = Generation(identity, ids, logprobs, answer.text or "", _finish(answer, ids, eos_token_id),
                                answer.prompt_tokens if answer.prompt_tokens is not None else params.input_len,
                                answer.cached_tokens or 0, answer.ttft or 0.0, answer.total or 0.0,
                                max_new_tokens=params.max_new_tokens)
        entry = self._open.get(identity)
        if entry is not None:
            entry.generation = generation
            # as parsed: the engine sent none (a stream's logprobs that were not one per id, dropped, were sent)
            entry.without_logprobs = answer.logprobs is None and not answer.logprobs_dropped
        return generation

    def keep_logprobs_missing(self, exchange: Exchange) -> None:
        """An engine answer without logprobs goes out without them (the formatters would write an empty list, and
        the request log would say logprobs were served): a client then reads the answer the engine gave. Unless
        a fault of the plan acted on them (edited entries, a rewritten answer with fresh logprobs)."""
        entry = self._open.get(exchange.generation.identity)
        if (entry is not None and entry.without_logprobs and exchange.generation.logprobs is None
                and exchange.logprob_entries is None):
            exchange.omit_logprobs = True

    def no_answer(self, identity: Identity, prompt_tokens: int, *, scratch: bool = False) -> Generation:
        """The generation of a request the engine was not asked (a fault answers in its place): nothing.
        `scratch`: for a look at what the plan would do, not the request's own."""
        generation = Generation(identity, [], None, "", None, prompt_tokens, 0, 0.0, 0.0)
        entry = None if scratch else self._open.get(identity)
        if entry is not None:
            entry.generation = generation
        return generation

    def record_outcome(self, identity: Identity, succeeded: bool) -> None:
        """The answer went out (or failed): settle the placement with what the client was served, once."""
        entry = self._open.pop(identity, None)
        if entry is None:
            return
        generation = entry.generation
        served = list(generation.output_ids) if generation is not None else []
        kind = ((generation.finish_reason or {}).get("type") if generation is not None else None) or "error"
        outcome = kind if succeeded and kind in ("stop", "length") else ("abort" if kind == "abort" else "error")
        self.tracker.settle(entry.placement, ids_key(served)[1:], outcome)


def _finish(answer: CapturedAnswer, ids: list[int], eos_token_id: int) -> dict[str, Any]:
    """SGLang's finish-reason object for the engine's answer (the OpenAI formatters map it back)."""
    reason = answer.finish_reason
    if isinstance(reason, dict) and reason.get("type") in ("stop", "length"):
        return dict(reason)
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return {**ABORTED, **reason}
    return {"type": "stop", "matched": ids[-1] if ids and ids[-1] == eos_token_id else None}
