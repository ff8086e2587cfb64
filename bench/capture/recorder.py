"""`rollout-bench record`: a reverse proxy that forwards everything unchanged and records generations as a trace.

Every request (generation routes, admin routes, anything) goes to the upstream with its method, path, query,
headers and body, and the upstream's status, headers and body come back as they were, streamed chunk by chunk.
Generation requests (`parse.GENERATION_PATHS`) are also read: placed in a trajectory when they arrive
(`tracker`), and when their answer is complete, recorded (`recording`) and appended to the file (`journal`).
Headers are never recorded, so credentials (Authorization, API keys) cannot reach the file; `redact_text`
drops every text and keeps ids.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from msgspec.structs import replace
from multidict import CIMultiDict
from yarl import URL

from bench.tokenizer import TOKENIZER_NAME
from bench.trace import TraceFormatError, TraceHeader, TraceSource, Trajectory
from bench.trace.schema import Prompt, Request, Response, ToolCall, ToolOutput, Turn

from .journal import Journal
from .encoding import StreamDecoder, decoded
from .parse import (
    GENERATION_PATHS,
    CaptureError,
    CapturedAnswer,
    CapturedError,
    CapturedInput,
    CapturedRequest,
    StreamAssembler,
    error_answers,
    parse_answer,
    parse_request,
)
from .recording import Recording
from .tracker import TrafficTracker, chat_key, chat_message_key, ids_key, text_key
from .upstream import UNKNOWN_VOCAB, UpstreamInfo, inferred_tokenizer, split_credentials

HOP_BY_HOP = frozenset(h.lower() for h in ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
                                           "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
                                           "Content-Encoding"))


@dataclass
class RecorderStats:
    exchanges: int = 0
    errors: int = 0
    unreadable: int = 0  # generation requests the recorder could not read (forwarded, not recorded)
    unrecordable: int = 0  # answers a trace cannot hold (an id past the vocabulary, ...): forwarded, noted
    notes: list[str] = field(default_factory=list)


def _forward_headers(headers: Any) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def _input_key(captured: CapturedInput) -> bytes:
    if captured.input_ids is not None:
        return ids_key(captured.input_ids)
    if captured.text is not None:
        return text_key(captured.text)
    return chat_key(captured.messages or [])


def _output_key(captured: CapturedInput, answer: CapturedAnswer) -> bytes:
    if captured.messages is not None:
        return chat_message_key("assistant", answer.text)
    if captured.input_ids is not None:
        return ids_key(answer.output_ids)[1:]
    return answer.text.encode("utf-8")


class Recorder:
    """The proxy and its recording; `app()` is the aiohttp application, `close()` the clean end."""

    def __init__(self, upstream: str, out: str | Path, info: UpstreamInfo, header: TraceHeader, tokenizer: Any,
                 *, redact_text: bool = False, force: bool = False) -> None:
        # credentials in the URL are sent as the client's Authorization when it sends none, never shown or written
        self.upstream, self._auth = split_credentials(upstream)
        self.info = info
        self.redact_text = redact_text
        self.tracker = TrafficTracker()
        self.recording = Recording(tokenizer, texts_from_ids=header.tokenizer.name == TOKENIZER_NAME)
        self.journal = Journal(out, header if not redact_text else _redacted_header(header), force=force)
        self.stats = RecorderStats()
        self._largest_id = -1
        self._stops: Counter[int] = Counter()
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        return app

    async def _open_session(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                              auto_decompress=False)

    async def _close_session(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    # -- forwarding --------------------------------------------------------------------------
    def _url(self, path_qs: str) -> URL:
        """The upstream URL of a path, built once per path (yarl parsing is a measurable share of a hop)."""
        url = self._urls.get(path_qs)
        if url is None:
            url = URL(self.upstream + path_qs, encoded=True)
            if len(self._urls) < 1024:
                self._urls[path_qs] = url
        return url

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        captured: CapturedRequest | None = None
        if request.method == "POST" and request.path in GENERATION_PATHS:
            try:
                captured = parse_request(request.path, body)
            except CaptureError as error:
                self.stats.unreadable += 1
                self._note(f"not recorded: {error}")
        placements = [self.tracker.place(_input_key(i)) for i in captured.inputs] if captured else []
        started = time.monotonic()
        assert self._session is not None
        try:
            headers = _forward_headers(request.headers)
            if self._auth is not None and "Authorization" not in headers:
                headers["Authorization"] = self._auth
            upstream = await self._session.request(request.method, self._url(request.path_qs), headers=headers,
                                                   data=body,
                                                   allow_redirects=False)  # a redirect is the client's to follow
        except (aiohttp.ClientError, OSError) as error:
            return self._bad_gateway(f"unreachable ({error.__class__.__name__}: {error})", captured, placements,
                                     started)
        try:
            return await self._relay(request, upstream, captured, placements, started)
        finally:
            upstream.release()

    def _bad_gateway(self, what: str, captured: CapturedRequest | None, placements: list[Any],
                     started: float) -> web.Response:
        """No answer from the upstream: the client gets a 502 saying why, and the recording an error turn."""
        message = f"rollout-bench record: upstream {self.upstream} {what}"
        if captured is not None:
            elapsed = time.monotonic() - started
            self._finish(captured, placements, [CapturedAnswer(error=CapturedError(502, message), ttft=elapsed,
                                                               total=elapsed) for _ in captured.inputs])
        return web.Response(status=502, text=message)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse, captured: CapturedRequest | None,
                     placements: list[Any], started: float) -> web.StreamResponse:
        headers = _forward_headers(upstream.headers)
        if upstream.headers.get("Content-Encoding"):
            headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
        streaming = captured is not None and captured.stream and upstream.status < 400
        encoding = upstream.headers.get("Content-Encoding", "").strip().lower()
        if not streaming:
            try:
                raw = await upstream.read()
            except (aiohttp.ClientError, OSError) as error:  # the upstream broke off (e.g. fewer bytes than said)
                return self._bad_gateway(f"broke off its answer ({error!r})", captured, placements, started)
            if captured is not None:
                elapsed = time.monotonic() - started
                readable, problem = decoded(raw, encoding)
                answers = (parse_answer(captured, upstream.status, readable, elapsed) if problem is None else
                           error_answers(captured, 502, problem.encode(), elapsed))
                self._finish(captured, placements, answers)
            return web.Response(status=upstream.status, body=raw, headers=headers)
        assert captured is not None
        assembler = StreamAssembler(captured, started)
        decoder = StreamDecoder(encoding)
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        recorded = False
        try:
            async for chunk in upstream.content.iter_any():
                assembler.feed(decoder.feed(chunk), time.monotonic())
                if assembler.done and not recorded:  # on disk before the client can see the stream end
                    recorded = True
                    self._finish(captured, placements, assembler.answers())
                await response.write(chunk)
            if not recorded:  # a stream that ended without `[DONE]`: on disk before it ends for the client too
                recorded = True
                self._finish(captured, placements, assembler.answers())
            await response.write_eof()
        finally:  # a client that went away, or an upstream that broke off: record what came, as it ended
            if not recorded:
                self._finish(captured, placements, assembler.answers())
        return response

    # -- recording ---------------------------------------------------------------------------
    def _finish(self, captured: CapturedRequest, placements: list[Any], answers: list[CapturedAnswer]) -> None:
        """Settle and record each exchange; an answer the trace cannot hold is counted and noted, never an error for
        the client (it has its answer already, or is about to)."""
        for item, placement, answer in zip(captured.inputs, placements, answers):
            self.tracker.settle(placement, _output_key(item, answer), answer.outcome)
            input_ids = item.input_ids if item.input_ids is not None else answer.prompt_ids
            try:
                fragment = self.recording.add(placement, item, answer, captured.endpoint, input_ids,
                                              check=self.journal.check)
            except TraceFormatError as error:
                self.stats.unrecordable += 1
                self._note(f"not recorded: {placement.trajectory} turn {placement.turn}: {error}")
                continue
            self.journal.append(_redact_trajectory(fragment) if self.redact_text else fragment)
            self._observe(answer, input_ids)
            self.stats.exchanges += 1
            self.stats.errors += answer.error is not None
        self.compact_if_due()

    def compact_if_due(self) -> None:
        """Join the fragments when the journal says it is time (also called on a timer while traffic is idle)."""
        if self.journal.wants_compaction():
            self.journal.compact(self._trajectories())

    def _observe(self, answer: CapturedAnswer, input_ids: list[int] | None) -> None:
        self._largest_id = max([self._largest_id, *answer.output_ids, *(input_ids or [])])
        matched = (answer.finish_reason or {}).get("matched")
        if isinstance(matched, int) and answer.output_ids and answer.output_ids[-1] == matched:
            self._stops[matched] += 1

    def _note(self, message: str) -> None:
        if len(self.stats.notes) < 100:
            self.stats.notes.append(message)

    def _trajectories(self) -> list[Trajectory]:
        trajectories = self.recording.trajectories()
        return [_redact_trajectory(t) for t in trajectories] if self.redact_text else trajectories

    def close(self) -> Path:
        """The clean end: whole trajectories, the header completed from what the traffic showed."""
        header = self.journal.header
        if header.tokenizer.vocab_size == UNKNOWN_VOCAB:
            tokenizer = inferred_tokenizer(header.tokenizer.name, self._largest_id, self._stops)
            details = dict(header.source.details) | {"tokenizer": "inferred from the traffic: vocab_size is the "
                                                     "largest id seen + 1, eos the stop matched most often"}
            header = replace(header, tokenizer=tokenizer, source=replace(header.source, details=details))
        details = dict(header.source.details) | {"exchanges": self.stats.exchanges, "errors": self.stats.errors,
                                                 "unreadable_requests": self.stats.unreadable,
                                                 "unrecordable_answers": self.stats.unrecordable}
        if self.stats.notes:
            details["notes"] = list(self.stats.notes)
        header = replace(header, source=replace(header.source, details=details))
        self.journal.close(self._trajectories(), header)
        return self.journal.path


# -- redaction -------------------------------------------------------------------------------
def _redacted_header(header: TraceHeader) -> TraceHeader:
    return replace(header, metadata=dict(header.metadata) | {"text_redacted": True})


def _redact_trajectory(trajectory: Trajectory) -> Trajectory:
    """Ids stay; every text goes (prompt, answers, tool calls' arguments and outputs)."""
    prompt = trajectory.prompt
    turns = []
    for turn in trajectory.turns:
        request = turn.request
        if request.messages is not None:
            request = Request(request.endpoint, request.sampling_params,
                              messages=[{"role": m.get("role"), "content": ""} for m in request.messages])
        elif request.text is not None:
            request = Request(request.endpoint, request.sampling_params, text="")
        response: Response = replace(turn.response, text="")
        if response.error is not None:  # a server's error message may quote the request
            response = replace(response, error=replace(response.error, message="(redacted)"))
        calls = [ToolCall(c.id, c.name, "{}") for c in turn.tool_calls]
        outputs = [ToolOutput(o.call_id, "", 0, o.tokens) for o in turn.tool_outputs]
        turns.append(Turn(request, response, calls, outputs))
    messages = None if prompt.messages is None else [{"role": m.get("role"), "content": ""} for m in prompt.messages]
    return replace(trajectory, prompt=Prompt(prompt.ids, "", messages, None), turns=turns,
                   metadata=_redacted_metadata(trajectory.metadata))


def _redacted_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """Error bodies and messages go too: a server's error may quote the request."""
    recording = dict(metadata.get("recording", {}))
    for key in ("errors", "attempts"):
        if key in recording:
            recording[key] = [{k: ("(redacted)" if k in ("body", "error") else v) for k, v in entry.items()}
                              for entry in recording[key]]
    if "error_body" in recording:
        recording["error_body"] = "(redacted)"
    return dict(metadata) | {"recording": recording}


def recording_header(info: UpstreamInfo, tokenizer_record: Any, tokenizer_source: str, upstream: str,
                     context_length: int | None, version: str) -> TraceHeader:
    context = context_length or info.context_length
    details: dict[str, Any] = {"upstream": upstream, "server": info.server, "tokenizer_from": tokenizer_source}
    if context is None:
        context, details["context_length"] = 32768, "not reported by the upstream; 32768 assumed (--context-length)"
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return TraceHeader(1, TraceSource("recorded", f"rollout-bench record {version}", details), info.model,
                       tokenizer_record, int(context), created)
