"""SGLang's native `POST /generate`: replayed answers, paced, abortable, streamed or not."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from ..replay import Generation, context_error
from . import wire
from .context import TRAJECTORY_HEADER, ServerContext, context_of
from .native_format import ABORTED, NativeFormatter
from .native_request import NativeItem, NativeRequest, Rejected, ValueRejected, decode_body, parse_generate
from .playback import Choice, new_record, play, reject
from .request_log import RequestRecord


async def generate(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    arrived = time.time()
    try:
        body = decode_body(await request.read())
    except Rejected as rejected:
        _log_rejection(ctx, request, arrived, rejected.response.status, "malformed body")
        return rejected.response
    stream = body.get("stream") is True
    try:
        parsed = parse_generate(body, ctx.config.profile, ctx.tokenizer, request.headers.get(TRAJECTORY_HEADER))
    except Rejected as rejected:
        _log_rejection(ctx, request, arrived, rejected.response.status, "rejected body")
        return rejected.response
    except ValueRejected as error:
        _log_rejection(ctx, request, arrived, 200 if stream else 400, error.message)
        return await _stream_error(request, ctx, error.message) if stream else wire.value_error(error.message)
    if parsed.stream:
        return await _generate_stream(request, ctx, parsed, arrived)
    results = await asyncio.gather(*(_run_whole(ctx, parsed, item, arrived, request) for item in parsed.items),
                                   return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, ValueRejected):
            raise result
    errors = [r for r in results if isinstance(r, ValueRejected)]
    if errors:
        return wire.value_error(errors[0].message)
    return wire.json_response(results if parsed.batch else results[0])


def _log_rejection(ctx: ServerContext, request: web.Request, arrived: float, status: int, error: str) -> None:
    ctx.log.append(RequestRecord(started=arrived, endpoint=request.path, status=status, error=error,
                                 latency_s=round(time.time() - arrived, 6)))


async def _stream_error(request: web.Request, ctx: ServerContext, message: str) -> web.StreamResponse:
    response = await _open_stream(request)
    await response.write(wire.stream_error_event(ctx.config.profile, message))
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


def _prepare(ctx: ServerContext, item: NativeItem) -> Generation:
    """Identify and answer an item; SGLang's request-level checks raise ValueRejected."""
    if item.rid in ctx.state.inflight:
        raise ValueRejected(f"Duplicate request ID detected: {item.rid}")
    generation = ctx.generate(item.ids, item.params, item.hint)
    max_new = 128 if item.params.max_new_tokens is None else item.params.max_new_tokens
    problem = context_error(len(item.ids), max_new, ctx.config.context_length,
                            legacy=ctx.config.profile.legacy_context_check)
    if problem is None and generation.is_error:
        problem = generation.error_message or "error"
    if problem is not None:
        ctx.identifier.record_outcome(generation.identity, succeeded=False)
        raise _Rejection(generation, problem)
    return generation


class _Rejection(ValueRejected):
    def __init__(self, generation: Generation, message: str) -> None:
        super().__init__(message)
        self.generation = generation


def _record(ctx: ServerContext, item: NativeItem, arrived: float, stream: bool,
            generation: Generation | None, endpoint: str) -> RequestRecord:
    return new_record(ctx, endpoint, arrived, rid=item.rid, stream=stream, prompt_tokens=len(item.ids),
                      generation=generation)


async def _run_whole(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, arrived: float,
                     request: web.Request) -> dict[str, Any]:
    try:
        generation = _prepare(ctx, item)
    except ValueRejected as rejection:
        record = _record(ctx, item, arrived, False, getattr(rejection, "generation", None), request.path)
        reject(ctx, record, 400, rejection.message, arrived)
        raise
    record = _record(ctx, item, arrived, False, generation, request.path)
    played = await play(ctx, Choice(item.index, item.ids, generation, item.rid, record), arrived)
    formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, parsed, ctx.state.weight_version)
    e2e = time.time() - arrived
    if played.queued:
        return formatter.queued_abort(item.rid, e2e)
    if played.aborted:
        return formatter.item(generation, item.rid, item.ids, upto=played.count, finish=ABORTED, e2e=e2e)
    return formatter.item(generation, item.rid, item.ids, e2e=e2e)


async def _generate_stream(request: web.Request, ctx: ServerContext, parsed: NativeRequest,
                           arrived: float) -> web.StreamResponse:
    response: web.StreamResponse | None = None
    for item in parsed.items:
        try:
            generation = _prepare(ctx, item)
        except ValueRejected as rejection:
            record = _record(ctx, item, arrived, True, getattr(rejection, "generation", None), request.path)
            reject(ctx, record, 200, rejection.message, arrived)
            response = response or await _open_stream(request)
            await response.write(wire.stream_error_event(ctx.config.profile, rejection.message))
            continue
        response = response or await _open_stream(request)
        await _stream_item(ctx, parsed, item, generation, response, arrived, request.path)
    response = response or await _open_stream(request)
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _stream_item(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, generation: Generation,
                       response: web.StreamResponse, arrived: float, endpoint: str) -> None:
    """One chunk per token (cumulative, or deltas with incremental streaming); the last one finishes."""
    record = _record(ctx, item, arrived, True, generation, endpoint)
    formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, parsed, ctx.state.weight_version)
    incremental = ctx.config.incremental_streaming
    total = len(generation.output_ids)
    sent = 0

    async def send(chunk: dict[str, Any]) -> None:
        if parsed.batch:
            chunk["index"] = item.index
        await response.write(wire.sse(chunk))

    async def on_token(count: int) -> None:
        nonlocal sent
        formatter.weight_version = ctx.state.weight_version
        final = count == total
        await send(formatter.item(generation, item.rid, item.ids, upto=count, finish=True if final else None,
                                  e2e=time.time() - arrived if final else None, first=count == 1,
                                  incremental_from=sent if incremental else 0))
        sent = count

    played = await play(ctx, Choice(item.index, item.ids, generation, item.rid, record), arrived, on_token)
    if played.queued:
        await send(formatter.queued_abort(item.rid, time.time() - arrived))
    elif played.aborted:
        chunk = formatter.item(generation, item.rid, item.ids, upto=played.count, finish=ABORTED,
                               e2e=time.time() - arrived, first=played.count == 0)
        if "output_ids" in chunk and not incremental:
            chunk["output_ids"] = chunk["output_ids"][-1:]  # sglang#34488: an abort chunk holds only the last id
        await send(chunk)
    elif total == 0:
        await send(formatter.item(generation, item.rid, item.ids, e2e=time.time() - arrived))
