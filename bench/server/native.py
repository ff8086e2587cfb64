"""SGLang's native `POST /generate`: replayed answers, faulted per plan, paced, streamed or not."""

from __future__ import annotations

import asyncio
import time
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.hdrs import CONTENT_TYPE

from bench.records.attribution import TRAJECTORY_HEADER
from bench.records.request_log import RequestRecord
from bench.replay import Generation, Identity, build_generation, context_error
from faults import FAULT_HEADER, Exchange, FaultError, PlanError, Rule, forced_rules
from faults.exchange import Transport as FaultTransport
from faults.engine import Decision

from . import served, transport, wire
from .context import Planned, ServerContext, context_of
from .native_format import ABORTED, NativeFormatter
from .native_fast import VERSION, FastRequest, Reply, accept, make_reply, native_request
from .native_request import NativeItem, NativeRequest, Rejected, ValueRejected, decode_body, parse_generate
from .playback import Choice, identified, logged_identified, new_record, play, played_at_once, reject, upstream_failed
from .served import SERVED_KEY


# The slow path answers a plain request 4 event-loop iterations after its handler first runs (the item's task is
# created; it yields once in `_run_whole`; its result reaches `gather`; `gather` wakes the handler). The fast path
# waits as many, so concurrent requests complete in the same order as they did: a rollout that gathers its
# requests sees an error answer before or after the others as it did (tests/test_provenance.py relies on it).
_SLOW_PATH_HOPS = 4


def _iterations_later(count: int) -> asyncio.Future[None]:
    """A future the awaiting task wakes from `count` loop iterations later: a chain of plain callbacks, cheaper than
    `count` task steps of `asyncio.sleep(0)` (the last iteration is the task's own wake-up)."""
    assert count >= 2, "at least the scheduling hop and the task's own wake-up"
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    loop.call_soon(_hop, loop, future, count - 2)
    return future


def _hop(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], left: int) -> None:
    """One loop iteration of `_iterations_later`. A module function, not a closure calling itself: that closure was
    a reference cycle (the function, its own cell), so every request left it and its future for the cyclic
    collector (2,000 of each alive at a young collection in a run)."""
    if left:
        loop.call_soon(_hop, loop, future, left - 1)
    elif not future.done():  # cancelled meanwhile: the client went away
        future.set_result(None)


class _Rejection(ValueRejected):
    """A ValueError after identification (context length, a recorded error): the attempt counts."""

    def __init__(self, generation: Generation, message: str) -> None:
        super().__init__(message)
        self.generation = generation


async def generate(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    arrived = time.time()
    try:
        header = request.headers.get(FAULT_HEADER)
        forced = forced_rules(header) if header else ()
        raw = await request.read()
        if ctx.fast_path and ctx.upstream is None and not forced:
            fast = accept(raw, request.headers.get(TRAJECTORY_HEADER), ctx.config.profile, ctx.replies.sampling,
                          ctx.tokenizer.vocab_size, ctx.replies.prompts, ctx.replies.bodies)
            if fast is not None:
                return await _generate_fast(request, ctx, fast, arrived)
        body = decode_body(raw)
    except (FaultError, PlanError) as error:
        _log_rejection(ctx, request, arrived, 400, str(error))
        return wire.json_response({"error": {"message": str(error), "type": "bench_fault_header"}}, 400)
    except Rejected as rejected:
        _log_rejection(ctx, request, arrived, rejected.response.status, "malformed body")
        return rejected.response
    stream = body.get("stream") is True
    try:
        parsed = parse_generate(body, ctx.config.profile, ctx.tokenizer, request.headers.get(TRAJECTORY_HEADER),
                                ctx.limits.max_n)
    except Rejected as rejected:
        if ctx.upstream is not None:  # the engine judges what the bench's parser does not know
            return await _pass_through(ctx, request, arrived, "rejected body")
        _log_rejection(ctx, request, arrived, rejected.response.status, rejected.why or "rejected body")
        return rejected.response
    except ValueRejected as error:
        if ctx.upstream is not None:
            return await _pass_through(ctx, request, arrived, error.message)
        _log_rejection(ctx, request, arrived, 200 if stream else 400, error.message)
        return await _stream_error(request, ctx, error.message) if stream else wire.value_error(error.message)
    answers: list[Any] = [None] * len(parsed.items)
    planned: list[Any] = [None] * len(parsed.items)
    if ctx.upstream is not None:  # placed and decided first: a fault that answers instead spares the engine
        planned = [ctx.plan_live(item.ids, item.hint, api="native", endpoint=request.path, stream=parsed.stream,
                                 forced=forced) for item in parsed.items]
        if not all(p.preempted for p in planned):
            fetched = await ctx.upstream.fetch(request)
            live = ctx.upstream.answers(request.path, await request.read(), fetched, len(parsed.items), ctx.tokenizer)
            if live is None:  # the engine's own error (or an answer the bench cannot read): as it came, unfaulted
                for item, plan in zip(parsed.items, planned):
                    record = new_record(ctx, request.path, arrived, rid=item.rid, stream=parsed.stream,
                                        prompt_tokens=len(item.ids))
                    upstream_failed(ctx, record, plan.identity, fetched.status, arrived)
                return ctx.upstream.pass_through(fetched)
            answers = [None if p.preempted else a for p, a in zip(planned, live)]
    prepared = [_prepare(ctx, request, parsed, item, arrived, forced, answer, plan)
                for item, answer, plan in zip(parsed.items, answers, planned)]
    return await _answer(request, ctx, parsed, prepared, arrived)


async def _answer(request: web.Request, ctx: ServerContext, parsed: NativeRequest, prepared: list[Any],
                  arrived: float) -> web.StreamResponse:
    """The slow path's answer to prepared items: faults, waits, then a body or a stream."""
    exchanges = [p for p in prepared if isinstance(p, tuple)]
    for _, record, exchange in exchanges:
        if exchange.replacement is not None:
            return transport.replacement_response(exchange.replacement)
        if exchange.transport.reset and not (parsed.stream and exchange.transport.cut_after_chunks is not None):
            # an identified attempt that got no answer failed: a retry of it is matched to this member
            reject(ctx, record, 0, "connection reset by a fault", arrived, exchange.generation)
            record.status = None
            return transport.drop_connection(request)
    first = exchanges[0][2] if exchanges else None
    if first is not None:
        await transport.wait_before_answer(first, ctx.state)
    if parsed.stream:
        content_type = first.content_type if first is not None else None
        return await _generate_stream(request, ctx, parsed, prepared, arrived, content_type)
    errors = [p for p in prepared if isinstance(p, ValueRejected)]
    if errors:
        return wire.value_error(errors[0].message)
    results = await asyncio.gather(*(_run_whole(ctx, parsed, item, record, exchange, arrived)
                                     for item, record, exchange in exchanges))
    return await transport.send_body(request, transport.encode(results if parsed.batch else results[0], first), first)


async def _generate_fast(request: web.Request, ctx: ServerContext, fast: FastRequest, arrived: float
                         ) -> web.StreamResponse:
    """One plain request (`native_fast`): logged, identified, decided, in flight and paced as on the slow path, its
    answer spliced into a saved reply. A fault firing, a request that is not a recorded turn, or a turn that is
    refused (context length, a recorded error) continues on the slow path from where this one is."""
    path = request.path
    if fast.rid in ctx.state.inflight:
        record = new_record(ctx, path, arrived, rid=fast.rid, stream=False, prompt_tokens=len(fast.ids))
        message = f"Duplicate request ID detected: {fast.rid}"
        reject(ctx, record, 400, message, arrived)
        return wire.value_error(message)
    packed = fast.packed
    identity = ctx.identifier.identify(packed, fast.hint)
    ctx.faults.observe(identity.trajectory, packed, ctx.tokenizer)  # did it act on an earlier faulted answer?
    decision = ctx.decide(identity, path, "native")
    reply = None
    recorded_turn = identity.drift is None and not identity.resume and identity.turn is not None
    key = (identity.trajectory, identity.turn, fast.key, fast.shape)
    if recorded_turn and decision is None:  # decided for "native": every rule in a decision acts on the answer
        reply = ctx.replies.get(key)
        if reply is False:
            reply = _new_reply(ctx, identity, fast, packed)
            ctx.replies.put(key, reply)
    record = logged_identified(ctx, path, arrived, fast.rid, identity, len(fast.ids))
    request[SERVED_KEY] = [record]  # its only record: any answer but the saved reply's (which names it) takes it
    if record.trajectory is not None:
        ctx.served.begin(record, packed, reply.prompt_digest if reply else None)
    if reply is None:  # the slow path, from here on
        generation = build_generation(identity, ctx.recorded(identity), fast.params, ctx.tokenizer, seed_bytes=packed)
        exchange = ctx.exchange(generation, api="native", endpoint=path, stream=False, rid=fast.rid,
                                decision=decision or Decision((), ctx.target(identity, path)))
        saved = ctx.replies.peek(key) if recorded_turn and decision is not None else None
        if saved and saved.instant and _spliceable(exchange, saved):
            return await _faulted_splice(request, ctx, fast, record, exchange, saved, arrived)
        parsed = native_request(fast)
        prepared = _checked(ctx, parsed, parsed.items[0], record, exchange, arrived)
        return await _answer(request, ctx, parsed, [prepared], arrived)
    await _iterations_later(_SLOW_PATH_HOPS)  # answered as many loop iterations after arriving as on the slow path
    if not (reply.instant and played_at_once(ctx, record, identity, fast.rid, fast.ids, reply.served, reply.finish,
                                             arrived)):
        generation = reply.generation_for(identity)
        choice = Choice(0, fast.ids, generation, fast.rid, record, None, fast.shape[0], reply.served)
        played = await play(ctx, choice, arrived)
        if played.queued or played.aborted:
            e2e = time.time() - arrived
            formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, native_request(fast), ctx.state.weight_version)
            item = (formatter.queued_abort(fast.rid, e2e) if played.queued else
                    formatter.item(generation, fast.rid, fast.ids, upto=played.count, finish=ABORTED, e2e=e2e))
            return web.Response(body=transport.encode(item, None), content_type=wire.JSON)
    return web.Response(body=reply.body(fast.rid, ctx.state.weight_version, time.time() - arrived),
                        headers=[(CONTENT_TYPE, wire.JSON), *served.served_header_pairs(record)])


def _answer_fields(generation: Generation) -> tuple[Any, ...]:
    """What a native body and its pacing take from a generation (its identity aside)."""
    return (generation.output_ids, generation.logprobs, generation.text, generation.finish_reason,
            generation.prompt_tokens, generation.cached_tokens, generation.ttft, generation.total,
            generation.error_status)


# An exchange's fields a fault may have set and the saved reply still answers (`_spliceable`): the version it
# reports goes where the saved reply's version goes, or the key goes with it; a content type, a cut or truncated
# body are how it travels.
# Every other field must be as a blank exchange has it, so a field added later keeps its answers on the slow path.
_GIVEN = frozenset({"api", "flavor", "endpoint", "stream", "generation", "weight_version", "context_length",
                    "tokenizer", "tools", "rng", "transport"})
_SPLICED = frozenset({"reported_weight_version", "omit_weight_version", "content_type", "corrupt_json"})
_UNSET = tuple((f.name, f.default) for f in fields(Exchange) if f.name not in _GIVEN | _SPLICED)
_UNSET_TRANSPORT = tuple((f.name, f.default) for f in fields(FaultTransport) if f.name != "truncate_at")
assert all(default is not MISSING for _, default in _UNSET + _UNSET_TRANSPORT), "a blank exchange's own values"
_exchange_unset = attrgetter(*(name for name, _ in _UNSET))
_transport_unset = attrgetter(*(name for name, _ in _UNSET_TRANSPORT))
_EXCHANGE_BLANK = tuple(default for _, default in _UNSET)
_TRANSPORT_BLANK = tuple(default for _, default in _UNSET_TRANSPORT)


def _spliceable(exchange: Exchange, saved: Reply) -> bool:
    """Whether the faults left a non-streamed answer the saved reply's body (made from its generation, unfaulted) but
    for the fields `_faulted_splice` puts in: nothing replaces, refuses, drops, delays or aborts it, its logprobs are
    shown as they are, and its generation is the saved one's."""
    return (_exchange_unset(exchange) == _EXCHANGE_BLANK and _transport_unset(exchange.transport) == _TRANSPORT_BLANK
            and _answer_fields(exchange.generation) == _answer_fields(saved.generation)
            and (not exchange.omit_weight_version or _VERSION_SLOT not in saved.order
                 or saved.pieces[saved.order.index(_VERSION_SLOT)].endswith(_VERSION_KEY)))


# the saved reply's weight version with its key (after the `id` key: never an object's first), which a
# `missing_weight_version` answer leaves out; outside a JSON string, where a quote is never bare, it is only there
_VERSION_KEY = b',"weight_version":'
_VERSION_SLOT = 1  # the version's place in `Reply.order` (a profile without the field has none: nothing to leave out)
_VERSION_ENTRY = _VERSION_KEY + msgspec.json.encode(VERSION)


async def _faulted_splice(request: web.Request, ctx: ServerContext, fast: FastRequest, record: RequestRecord,
                          exchange: Exchange, saved: Reply, arrived: float) -> web.StreamResponse:
    """A faulted plain request whose faults left its body the unfaulted one but for the reported weight version, or
    changed only how it travels (content type, a cut or truncated body; stream faults on a whole answer): the saved
    reply's bytes, as the slow path would format them, sent the slow path's way, as many loop iterations later.
    The record, outcome and served tokens are those `play` keeps (the reported version with them)."""
    await _iterations_later(_SLOW_PATH_HOPS)
    if not played_at_once(ctx, record, exchange.generation.identity, fast.rid, fast.ids, saved.served, saved.finish,
                          arrived):  # paused: `play` waits for generation to continue, as on the slow path
        parsed = native_request(fast)
        played = await _played_item(ctx, parsed, parsed.items[0], record, exchange, arrived)
        return await transport.send_body(request, transport.encode(played, exchange), exchange)
    version = None if exchange.omit_weight_version else exchange.reported_weight_version or ctx.state.weight_version
    if record.weight_version is not None:  # its served tokens were kept (`play` keeps the version it reported)
        record.weight_version = version
    if version is None:
        body = saved.body(fast.rid, VERSION, time.time() - arrived).replace(_VERSION_ENTRY, b"", 1)
    else:
        body = saved.body(fast.rid, version, time.time() - arrived)
    return await transport.send_body(request, transport.corrupted(body) if exchange.corrupt_json else body, exchange)


def _new_reply(ctx: ServerContext, identity: Identity, fast: FastRequest, packed: bytes) -> Reply | None:
    """The saved reply for a plain request's turn and shape, or None when the slow path must answer it (the turn is
    refused: the context-length check, a recorded error)."""
    generation = build_generation(identity, ctx.recorded(identity), fast.params, ctx.tokenizer, seed_bytes=packed)
    max_new = 128 if fast.params.max_new_tokens is None else fast.params.max_new_tokens
    if generation.is_error or context_error(len(fast.ids), max_new, ctx.config.context_length,
                                            legacy=ctx.config.profile.legacy_context_check) is not None:
        return None
    return make_reply(generation, ctx.config.profile, ctx.tokenizer, native_request(fast), packed,
                      ctx.config.time_scale)


def _log_rejection(ctx: ServerContext, request: web.Request, arrived: float, status: int, error: str) -> None:
    reject(ctx, new_record(ctx, request.path, arrived), status, error, arrived)


async def _stream_error(request: web.Request, ctx: ServerContext, message: str) -> web.StreamResponse:
    response = await _open_stream(request)
    await response.write(wire.stream_error_event(ctx.config.profile, message))
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _open_stream(request: web.Request, content_type: str | None = None) -> web.StreamResponse:
    """A 200 event stream (under another content type when a `wrong_content_type` fault says so)."""
    response = web.StreamResponse(status=200, headers={"Content-Type": content_type or "text/event-stream"})
    await served.prepare(response, request)
    return response


async def _pass_through(ctx: ServerContext, request: web.Request, arrived: float, why: str) -> web.Response:
    """Upstream mode: a request the bench's parser refuses goes to the engine as it is; its answer comes back
    unfaulted (logged unidentified, with the parser's reason)."""
    assert ctx.upstream is not None
    fetched = await ctx.upstream.fetch(request)
    _log_rejection(ctx, request, arrived, fetched.status, f"passed through: {why}")
    return ctx.upstream.pass_through(fetched)


def _prepare(ctx: ServerContext, request: web.Request, parsed: NativeRequest, item: NativeItem, arrived: float,
             forced: tuple[Rule, ...], answer: Any = None, planned: Planned | None = None
             ) -> tuple[NativeItem, RequestRecord, Exchange] | ValueRejected:
    """Identify an item, let the fault plan act, then run SGLang's request checks."""
    record = new_record(ctx, request.path, arrived, rid=item.rid, stream=parsed.stream, prompt_tokens=len(item.ids),
                        request=request)
    if ctx.upstream is None and item.rid in ctx.state.inflight:  # upstream mode: the engine accepted it
        message = f"Duplicate request ID detected: {item.rid}"
        reject(ctx, record, 200 if parsed.stream else 400, message, arrived)
        return ValueRejected(message)
    generation = ctx.generate(item.ids, item.params, item.hint, answer, planned)
    identified(ctx, record, generation, item.ids)
    exchange = ctx.exchange(generation, api="native", endpoint=request.path, stream=parsed.stream, rid=item.rid,
                            forced=forced, decision=planned.decision if planned else None)
    return _checked(ctx, parsed, item, record, exchange, arrived)


def _checked(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, record: RequestRecord, exchange: Exchange,
             arrived: float) -> tuple[NativeItem, RequestRecord, Exchange] | ValueRejected:
    """After the fault plan had its say: a replacing fault, then SGLang's context-length check and a recorded error."""
    generation = exchange.generation
    if exchange.replacement is not None:
        reject(ctx, record, exchange.replacement.status, "fault replacement", arrived, generation)
        return item, record, exchange
    max_new = 128 if item.params.max_new_tokens is None else item.params.max_new_tokens
    problem = None if ctx.upstream is not None and exchange.refusal_context is None else context_error(
        len(item.ids), max_new, exchange.refusal_context or ctx.config.context_length,
        legacy=ctx.config.profile.legacy_context_check)  # upstream mode: the engine checked its own context
    if problem is None and generation.is_error:
        problem = generation.error_message or "error"
    if problem is not None:
        reject(ctx, record, 200 if parsed.stream else 400, problem, arrived, generation)
        return _Rejection(generation, problem)
    return item, record, exchange


def _choice(parsed: NativeRequest, item: NativeItem, record: RequestRecord, exchange: Exchange) -> Choice:
    return Choice(item.index, item.ids, exchange.generation, item.rid, record, exchange, parsed.return_logprob)


async def _run_whole(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, record: RequestRecord,
                     exchange: Exchange, arrived: float) -> dict[str, Any]:
    generation = exchange.generation
    await asyncio.sleep(exchange.transport.first_token_delay)
    formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, parsed, ctx.state.weight_version, exchange)
    if exchange.queued_abort:
        reject(ctx, record, 200, "aborted in the waiting queue", arrived, generation)
        record.finish = "abort"
        return formatter.queued_abort(item.rid, time.time() - arrived)
    return await _played_item(ctx, parsed, item, record, exchange, arrived, formatter)


async def _played_item(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, record: RequestRecord,
                       exchange: Exchange, arrived: float, formatter: NativeFormatter | None = None) -> dict[str, Any]:
    """The item played in time, then formatted as it ended (whole, aborted, or aborted while queued)."""
    generation = exchange.generation
    played = await play(ctx, _choice(parsed, item, record, exchange), arrived)
    if formatter is None:
        formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, parsed, ctx.state.weight_version, exchange)
    formatter.weight_version = ctx.state.weight_version
    e2e = time.time() - arrived
    if played.queued:
        return formatter.queued_abort(item.rid, e2e)
    if played.aborted:
        return formatter.item(generation, item.rid, item.ids, upto=played.count, finish=ABORTED, e2e=e2e)
    return formatter.item(generation, item.rid, item.ids, e2e=e2e)


class _StreamCut(Exception):
    """A `stream_cut` or `truncated_body` fault ended the stream; `drop`: without a clean end."""

    def __init__(self, exchange: Exchange, drop: bool) -> None:
        super().__init__()
        self.exchange = exchange
        self.drop = drop


async def _generate_stream(request: web.Request, ctx: ServerContext, parsed: NativeRequest,
                           prepared: list[Any], arrived: float, content_type: str | None = None
                           ) -> web.StreamResponse:
    response = await _open_stream(request, content_type)
    try:
        for entry in prepared:
            if isinstance(entry, ValueRejected):
                await response.write(wire.stream_error_event(ctx.config.profile, entry.message))
                continue
            item, record, exchange = entry
            await _stream_item(ctx, parsed, item, record, exchange, response, arrived)
    except _StreamCut as cut:
        if cut.drop:
            return transport.drop_connection(request)
        if cut.exchange.transport.done_after_cut:
            await response.write(wire.SSE_DONE)
        await response.write_eof()
        return response
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _stream_item(ctx: ServerContext, parsed: NativeRequest, item: NativeItem, record: RequestRecord,
                       exchange: Exchange, response: web.StreamResponse, arrived: float) -> None:
    """One event per token (cumulative, or deltas with incremental streaming); the last one finishes."""
    generation = exchange.generation
    formatter = NativeFormatter(ctx.config.profile, ctx.tokenizer, parsed, ctx.state.weight_version, exchange)
    incremental = ctx.config.incremental_streaming
    total = len(generation.output_ids)
    sent = 0
    events = 0
    corrupt = exchange.corrupt_json
    cut_after = exchange.transport.cut_after_chunks
    keep = exchange.transport.truncate_at  # truncated_body: the worker dies in the middle of an event
    truncate_at = None if keep is None else int(max(1, total) * keep)

    async def send(chunk: dict[str, Any], last: bool = True) -> None:
        nonlocal events, corrupt
        if cut_after is not None and events >= cut_after:
            raise _StreamCut(exchange, drop=exchange.transport.reset)
        if parsed.batch:
            chunk["index"] = item.index
        body = transport.encode(chunk, exchange, corrupt=corrupt)
        corrupt = False  # one broken event is enough
        event = b"data: " + body + b"\n\n"
        if truncate_at is not None and (events >= truncate_at or last):
            await response.write(event[: len(event) // 2])
            raise _StreamCut(exchange, drop=True)
        await response.write(event)
        events += 1

    async def on_token(count: int) -> None:
        nonlocal sent
        formatter.weight_version = ctx.state.weight_version
        final = count == total and not exchange.omit_finish_reason
        chunk = formatter.item(generation, item.rid, item.ids, upto=count, finish=True if final else None,
                               e2e=time.time() - arrived if final else None, first=count == 1,
                               incremental_from=sent if incremental else 0)
        if final and _is_abort(generation.finish_reason) and "output_ids" in chunk and not incremental:
            chunk["output_ids"] = chunk["output_ids"][-1:]  # an `abort` fault's last chunk, as sglang#34488
        await send(chunk, last=count == total)
        sent = count

    await asyncio.sleep(exchange.transport.first_token_delay)
    if exchange.queued_abort:
        reject(ctx, record, 200, "aborted in the waiting queue", arrived, generation)
        record.finish = "abort"
        await send(formatter.queued_abort(item.rid, time.time() - arrived))
        return
    played = await play(ctx, _choice(parsed, item, record, exchange), arrived, on_token)
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


def _is_abort(finish: Any) -> bool:
    return isinstance(finish, dict) and finish.get("type") == "abort"
