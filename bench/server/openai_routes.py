"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, vLLM `/inference/v1/generate`.

Shaped like vLLM (default) or SGLang per `ServerConfig.openai_flavor` (WIRE.md 3.1-3.3).
Where the two servers differ in *when* they refuse, so does the bench: vLLM checks the
context length before it starts a stream (a plain 400 even for `stream: true`), SGLang
inside it (HTTP 200, one `data: {"error": ...}` event, then `[DONE]`). An aborted request
ends with finish_reason "abort" in both flavors; vLLM's engine reports aborts with that
same string, and its clients treat anything but stop/length/tool_calls as unknown.

Every choice is an attempt the fault engine decides about (`ctx.exchange(api="openai")`,
plus the faults an `X-Bench-Fault` header forces). A replacement (an HTTP error) or a reset
answers for the whole request before anything else is sent; a claimed context length refuses
it as the flavor would; the rest shapes how the choices are played and written
(`openai_stream`, `openai_format`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Callable

from aiohttp import web
from aiohttp.hdrs import CONTENT_TYPE

from bench.records.attribution import TRAJECTORY_HEADER
from bench.records.request_log import RequestRecord
from bench.replay import Generation, Identity, build_generation, context_error
from bench.tokenizer import ByteBPETokenizer
from faults import FAULT_HEADER, Exchange, FaultError, PlanError, Replacement, Rule, forced_rules
from faults.engine import Decision

from . import served, transport, wire
from .context import Planned, ServerContext, context_of
from .native import _iterations_later
from .openai_answer import settle
from .openai_fast import ChatReply, FastChat, make_reply
from .openai_format import OpenAIFormatter
from .openai_request import BadRequest, OpenAIRequest, decode_body, parse_chat, parse_completion, parse_generate
from .openai_stream import play_choice, stream_choices, wire_faults
from .playback import Choice, identified, logged_identified, new_record, play, played_at_once, reject, upstream_failed
from .served import SERVED_KEY

Parser = Callable[[dict[str, Any], str, ByteBPETokenizer], OpenAIRequest]
_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-", "generate": "generate-tokens-"}
# The slow path answers a plain chat request 4 event-loop iterations after its handler first runs (the choice's task
# is created; it yields once in `play_choice`; its result reaches `gather`; `gather` wakes the handler). The fast path
# waits as many, so concurrent requests complete in the same order as they did (tests/test_chat_fast_path.py counts).
_CHAT_SLOW_PATH_HOPS = 4


class _Refused(Exception):
    """A request refused after identification: context length, duplicate rid, recorded error."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, in_band: bool = False) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.in_band = message, status, param, in_band


class _Faulted(Exception):
    """A fault answers for the server: `replacement` (an HTTP error), else a dropped connection."""

    def __init__(self, replacement: Replacement | None) -> None:
        super().__init__("fault replacement" if replacement else "connection reset by a fault")
        self.replacement = replacement
        self.status = replacement.status if replacement else None


def vllm_context_error(input_len: int, requested: int, context_length: int) -> str | None:
    """vLLM v0.18+'s context-length 400 text, or None when the request fits."""
    if input_len < context_length and input_len + requested <= context_length:
        return None
    return (f"This model's maximum context length is {context_length} tokens. However, you requested {requested} "
            f"output tokens and your prompt contains {input_len} input tokens, for a total of "
            f"{input_len + requested} tokens. Please reduce the length of the input prompt or the number of "
            f"requested output tokens. (parameter=input_tokens, value={input_len})")


def _faults_answer(parsed: OpenAIRequest, exchange: Exchange) -> None:
    """Raise `_Faulted` when a fault answers instead of the server (a stream cut resets later)."""
    if exchange.replacement is not None:
        raise _Faulted(exchange.replacement)
    if exchange.transport.reset and not (parsed.stream and exchange.transport.cut_after_chunks is not None):
        raise _Faulted(None)


def _check(ctx: ServerContext, parsed: OpenAIRequest, ids: list[int], generation: Generation, rid: str | None,
           context_length: int) -> None:
    """The server's checks that need the identified answer; raise `_Refused` (`rid` None: all but the duplicate
    request id, which depends on what is in flight)."""
    config, flavor, asked = ctx.config, ctx.config.openai_flavor, parsed.sampling.max_tokens
    if flavor == "sglang":
        problem = context_error(len(ids), asked or 0, context_length, legacy=config.profile.legacy_context_check)
        if problem is not None:
            raise _Refused(problem, in_band=parsed.stream)
        if parsed.client_id is not None and rid is not None and rid in ctx.state.inflight:
            raise _Refused(f"Duplicate request ID detected: {rid}", in_band=parsed.stream)
    else:
        requested = asked if asked is not None else max(0, context_length - len(ids))
        problem = vllm_context_error(len(ids), requested, context_length)
        if problem is not None:
            raise _Refused(problem, param="input_tokens")
    if generation.is_error:
        raise _Refused(generation.error_message or "error", generation.error_status or 500, in_band=parsed.stream)


def _choices(ctx: ServerContext, request: web.Request, parsed: OpenAIRequest, base_id: str, arrived: float,
             forced: tuple[Rule, ...], live: tuple[list[Any], list[Planned]] | None = None
             ) -> tuple[list[Choice], list[Exchange]]:
    """Identify every (prompt, n) choice and let the faults decide; the first refusal stops the request."""
    hint = request.headers.get(TRAJECTORY_HEADER)
    single = len(parsed.prompts) * parsed.sampling.n == 1
    vllm = ctx.config.openai_flavor != "sglang"
    choices: list[Choice] = []
    exchanges: list[Exchange] = []
    for ids in parsed.prompts:
        params = parsed.sampling.params(len(ids), ctx.config.context_length)
        for _ in range(parsed.sampling.n):
            rid = base_id if single else wire.fresh_id()
            if vllm and rid in ctx.state.inflight:  # a client-chosen request_id already running: keep both apart
                rid = wire.fresh_id()
            answer, planned = (live[0][len(choices)], live[1][len(choices)]) if live else (None, None)
            generation = ctx.generate(ids, params, hint, answer, planned)
            record = new_record(ctx, request.path, arrived, rid=rid, stream=parsed.stream, prompt_tokens=len(ids),
                                request=request)
            identified(ctx, record, generation, ids)
            exchange = ctx.exchange(generation, api="openai", endpoint=request.path, stream=parsed.stream, rid=rid,
                                    forced=forced, decision=planned.decision if planned else None)
            later = live[1][len(choices) + 1:] if live else ()  # placed upstream-side, never answered on a refusal
            choices.append(_admitted(ctx, parsed, ids, rid, record, exchange, arrived, choices, later))
            exchanges.append(exchange)
    return choices, exchanges


def _admitted(ctx: ServerContext, parsed: OpenAIRequest, ids: list[int], rid: str, record: RequestRecord,
              exchange: Exchange, arrived: float, earlier: list[Choice], later: Sequence[Planned] = ()) -> Choice:
    """A choice after the fault plan had its say: answered by a fault or refused by the server's checks (raising
    `_Refused` or `_Faulted`, with it and the `earlier` choices logged as never played), else ready to play."""
    generation = exchange.generation
    try:
        _faults_answer(parsed, exchange)
        if ctx.upstream is None or exchange.refusal_context is not None:  # else the engine checked its own
            _check(ctx, parsed, ids, generation, rid, exchange.refusal_context or ctx.config.context_length)
    except (_Refused, _Faulted) as stop:
        status = 200 if isinstance(stop, _Refused) and stop.in_band else stop.status
        for choice in [*earlier, Choice(len(earlier), ids, generation, rid, record)]:
            _refused(ctx, choice, status, str(stop), arrived)  # identified, never played
        for planned in later:
            ctx.identifier.record_outcome(planned.identity, succeeded=False)
        raise
    return Choice(len(earlier), ids, generation, rid, record, exchange, parsed.logprobs)


def _refused(ctx: ServerContext, choice: Choice, status: int | None, error: str, arrived: float) -> None:
    """Log a choice that was never played; `status` None: no answer at all."""
    reject(ctx, choice.record, status or 0, error, arrived, choice.generation)
    choice.record.status = status


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await served.prepare(response, request)
    return response


async def _refuse_in_band(request: web.Request, flavor: str, refused: _Refused) -> web.StreamResponse:
    response = await _open_stream(request)
    await response.write(wire.openai_stream_error(flavor, refused.message, refused.status, param=refused.param))
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _whole(request: web.Request, ctx: ServerContext, parsed: OpenAIRequest, choices: list[Choice],
                 exchanges: list[Exchange], formatter: OpenAIFormatter, arrived: float) -> web.StreamResponse:
    played = await asyncio.gather(*(play_choice(ctx, c, e, arrived) for c, e in zip(choices, exchanges)))
    settled = [settle(c.generation, p.count, p.aborted, parsed, ctx.tokenizer, e)
               for c, p, e in zip(choices, played, exchanges)]
    version = ctx.state.weight_version
    if parsed.kind == "chat":
        body = formatter.chat_body(choices[0].prompt_ids, settled, version)
    elif parsed.kind == "completion":
        body = formatter.completion_body(parsed.prompts, settled, version)
    else:
        body = formatter.generate_body(settled)
    carrier = wire_faults(exchanges)
    return await transport.send_body(request, transport.encode(body, carrier), carrier)


def _forced(request: web.Request) -> tuple[Rule, ...]:
    """The faults an `X-Bench-Fault` header forces (`forced_rules` refuses client-side ones)."""
    header = request.headers.get(FAULT_HEADER)
    return forced_rules(header) if header else ()


async def _wait_before_answer(ctx: ServerContext, choices: list[Choice], exchanges: list[Exchange]) -> None:
    """Latency and stall faults hold the whole answer; a client giving up meanwhile is logged."""
    try:
        await transport.wait_before_answer(max(exchanges, key=lambda e: e.transport.delay), ctx.state)
    except asyncio.CancelledError:
        for choice in choices:
            choice.record.client_disconnected = True
            ctx.identifier.record_outcome(choice.generation.identity, succeeded=False)
        raise


async def _serve(request: web.Request, kind: str, parser: Parser) -> web.StreamResponse:
    ctx, arrived = context_of(request), time.time()
    flavor = ctx.config.openai_flavor
    fast: FastChat | None = None
    try:
        forced = _forced(request)
        raw = await request.read()
        if kind == "chat" and ctx.fast_path and ctx.upstream is None and not forced:
            fast = ctx.chat_replies.parse(raw, flavor, ctx.tokenizer, ctx.config.context_length)
            parsed = fast.parsed
        else:
            parsed = parser(decode_body(raw), flavor, ctx.tokenizer)
        if parsed.sampling.n > ctx.limits.max_n:
            raise BadRequest(f"n must be at most {ctx.limits.max_n} (the bench server's limit, --max-n), "
                             f"got {parsed.sampling.n}.", param="n")
    except (FaultError, PlanError) as error:
        reject(ctx, new_record(ctx, request.path, arrived), 400, str(error), arrived)
        return wire.openai_error(flavor, str(error), 400, "bench_fault_header")
    except BadRequest as error:
        if ctx.upstream is not None:  # the engine judges what the bench's parser does not know
            fetched = await ctx.upstream.fetch(request)
            reject(ctx, new_record(ctx, request.path, arrived), fetched.status, f"passed through: {error.message}",
                   arrived)
            return ctx.upstream.pass_through(fetched)
        reject(ctx, new_record(ctx, request.path, arrived), 400, error.message, arrived)
        return wire.openai_error(flavor, error.message, 400, error.err_type, error.param)
    if fast is not None and fast.eligible:
        return await _chat_fast(request, ctx, fast, arrived)
    base_id = parsed.client_id or wire.fresh_id()
    live = None
    if ctx.upstream is not None:
        live = await _upstream_answers(ctx, request, parsed, arrived, forced)
        if not isinstance(live, tuple):
            return live
    try:
        choices, exchanges = _choices(ctx, request, parsed, base_id, arrived, forced, live)
    except (_Refused, _Faulted) as stop:
        return await _stopped(request, flavor, stop)
    return await _answer(request, ctx, parsed, kind, base_id, choices, exchanges, arrived)


async def _stopped(request: web.Request, flavor: str, stop: _Refused | _Faulted) -> web.StreamResponse:
    """The answer to a request a refusal or a fault stopped before any choice played."""
    if isinstance(stop, _Refused):
        if stop.in_band:
            return await _refuse_in_band(request, flavor, stop)
        return wire.openai_error(flavor, stop.message, stop.status, param=stop.param)
    if stop.replacement is not None:
        return transport.replacement_response(stop.replacement)
    return transport.drop_connection(request)


async def _answer(request: web.Request, ctx: ServerContext, parsed: OpenAIRequest, kind: str, base_id: str,
                  choices: list[Choice], exchanges: list[Exchange], arrived: float) -> web.StreamResponse:
    """The slow path's answer to admitted choices: waits, then a body or a stream."""
    await _wait_before_answer(ctx, choices, exchanges)
    flavor = ctx.config.openai_flavor
    response_id = base_id if flavor == "sglang" and kind != "generate" else _PREFIX[kind] + base_id
    formatter = OpenAIFormatter(flavor, parsed, ctx.tokenizer, ctx.config.model_name, response_id)
    if parsed.stream:
        return await stream_choices(request, ctx, parsed, choices, exchanges, formatter, arrived)
    return await _whole(request, ctx, parsed, choices, exchanges, formatter, arrived)


async def _chat_fast(request: web.Request, ctx: ServerContext, fast: FastChat, arrived: float) -> web.StreamResponse:
    """One plain chat request (`openai_fast`): identified, decided, logged and played as on the slow path, its answer
    spliced into a saved reply. A fault firing, a request that is not a recorded turn, or a turn the server refuses
    (context length, a duplicate rid, a recorded error) continues on the slow path from where this one is."""
    parsed, flavor, path = fast.parsed, ctx.config.openai_flavor, request.path
    base_id = parsed.client_id or wire.fresh_id()
    rid = base_id
    vllm = flavor != "sglang"
    if vllm and rid in ctx.state.inflight:  # a client-chosen request_id already running: keep both apart
        rid = wire.fresh_id()
    identity = ctx.identifier.identify(fast.packed, request.headers.get(TRAJECTORY_HEADER))
    ctx.faults.observe(identity.trajectory, fast.packed, ctx.tokenizer)  # did it act on an earlier faulted answer?
    decision = ctx.decide(identity, path, "openai")  # only rules that act on the answer: any of them takes the slow path
    reply = None
    if (identity.drift is None and not identity.resume and identity.turn is not None and decision is None
            and (vllm or parsed.client_id is None or rid not in ctx.state.inflight)):
        key = (identity.trajectory, identity.turn, fast)
        reply = ctx.chat_replies.get(key)
        if reply is False:
            reply = _new_chat_reply(ctx, identity, fast)
            if fast.kept:  # else no later request can name it
                ctx.chat_replies.put(key, reply, fast.size)
    record = logged_identified(ctx, path, arrived, rid, identity, len(fast.ids))
    request[SERVED_KEY] = [record]  # its only record: any answer but the saved reply's (which names it) takes it
    if record.trajectory is not None:
        ctx.served.begin(record, fast.packed, reply.prompt_digest if reply else None)
    if reply is None:  # the slow path, from here on
        generation = build_generation(identity, ctx.recorded(identity), fast.params, ctx.tokenizer,
                                      seed_bytes=fast.packed)
        exchange = ctx.exchange(generation, api="openai", endpoint=path, stream=False, rid=rid,
                                decision=decision or Decision((), ctx.target(identity, path)))
        try:
            choice = _admitted(ctx, parsed, fast.ids, rid, record, exchange, arrived, [])
        except (_Refused, _Faulted) as stop:
            return await _stopped(request, flavor, stop)
        return await _answer(request, ctx, parsed, "chat", base_id, [choice], [exchange], arrived)
    await _iterations_later(_CHAT_SLOW_PATH_HOPS)  # as many loop iterations after arriving as the slow path
    response_id = base_id if not vllm else _PREFIX["chat"] + base_id
    if not (reply.instant and played_at_once(ctx, record, identity, rid, fast.ids, reply.served, reply.finish,
                                             arrived)):
        generation = reply.generation_for(identity)
        played = await play(ctx, Choice(0, fast.ids, generation, rid, record, None, parsed.logprobs, reply.served),
                            arrived)
        if played.aborted:
            settled = settle(generation, played.count, True, parsed, ctx.tokenizer)
            formatter = OpenAIFormatter(flavor, parsed, ctx.tokenizer, ctx.config.model_name, response_id)
            body = formatter.chat_body(fast.ids, [settled], ctx.state.weight_version)
            return web.Response(body=transport.encode(body, None), content_type=wire.JSON)
    return web.Response(body=reply.body(response_id, ctx.state.weight_version),
                        headers=[(CONTENT_TYPE, wire.JSON), *served.served_header_pairs(record)])


def _new_chat_reply(ctx: ServerContext, identity: Identity, fast: FastChat) -> ChatReply | None:
    """The saved reply for a plain chat request's turn, or None when the slow path must answer it (the server refuses
    the turn: its context-length check, a recorded error)."""
    generation = build_generation(identity, ctx.recorded(identity), fast.params, ctx.tokenizer, seed_bytes=fast.packed)
    try:
        _check(ctx, fast.parsed, fast.ids, generation, None, ctx.config.context_length)
    except _Refused:
        return None
    return make_reply(generation, fast, ctx.config.openai_flavor, ctx.tokenizer, ctx.config.model_name,
                      ctx.config.time_scale, ctx.chat_replies)


async def _upstream_answers(ctx: ServerContext, request: web.Request, parsed: OpenAIRequest, arrived: float,
                            forced: tuple[Rule, ...]) -> tuple[list[Any], list[Planned]] | web.Response:
    """Upstream mode: every choice placed and decided, then the engine's answer, one per choice (none where a
    fault answers instead; the engine is not asked when every choice's does); or, for the engine's own error (or
    an answer the bench cannot read), that answer as it came, unfaulted, with every choice's attempt failed."""
    assert ctx.upstream is not None
    hint = request.headers.get(TRAJECTORY_HEADER)
    planned = [ctx.plan_live(ids, hint, api="openai", endpoint=request.path, stream=parsed.stream, forced=forced)
               for ids in parsed.prompts for _ in range(parsed.sampling.n)]
    if all(p.preempted for p in planned):
        return [None] * len(planned), planned
    fetched = await ctx.upstream.fetch(request)
    answers = ctx.upstream.answers(request.path, await request.read(), fetched, len(planned), ctx.tokenizer)
    if answers is not None:
        return [None if p.preempted else a for p, a in zip(planned, answers)], planned
    for ids, plan in zip([ids for ids in parsed.prompts for _ in range(parsed.sampling.n)], planned):
        record = new_record(ctx, request.path, arrived, stream=parsed.stream, prompt_tokens=len(ids))
        upstream_failed(ctx, record, plan.identity, fetched.status, arrived)
    return ctx.upstream.pass_through(fetched)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "chat", parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "completion", parse_completion)


async def inference_generate(request: web.Request) -> web.StreamResponse:
    """vLLM's token-in/token-out route; an SGLang server has no such path."""
    if context_of(request).config.openai_flavor == "sglang":
        await request.read()
        return wire.json_response({"detail": "Not Found"}, 404)
    return await _serve(request, "generate", lambda body, _flavor, tokenizer: parse_generate(body, tokenizer))


def add_openai_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes on the bench app."""
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/inference/v1/generate", inference_generate)
