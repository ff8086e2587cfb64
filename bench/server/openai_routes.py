"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, vLLM `/inference/v1/generate`.

Shaped like vLLM (default) or SGLang per `ServerConfig.openai_flavor` (WIRE.md 3.1-3.3).
Where the two servers differ in *when* they refuse, so does the bench: vLLM checks the
context length before it starts a stream (a plain 400 even for `stream: true`), SGLang
inside it (HTTP 200, one `data: {"error": ...}` event, then `[DONE]`). An aborted request
ends with finish_reason "abort" in both flavors; vLLM's engine reports aborts with that
same string, and its clients treat anything but stop/length/tool_calls as unknown.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

from aiohttp import web

from ..replay import Generation, context_error
from ..tokenizer import ByteBPETokenizer
from . import wire
from .context import TRAJECTORY_HEADER, ServerContext, context_of
from .openai_answer import settle
from .openai_format import OpenAIFormatter
from .playback import Choice, Played, new_record, play, reject
from .openai_request import BadRequest, OpenAIRequest, decode_body, parse_chat, parse_completion, parse_generate

Parser = Callable[[dict[str, Any], str, ByteBPETokenizer], OpenAIRequest]
_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-", "generate": "generate-tokens-"}


class _Refused(Exception):
    """A request refused after identification: context length, duplicate rid, recorded error."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, in_band: bool = False) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.in_band = message, status, param, in_band


def vllm_context_error(input_len: int, requested: int, context_length: int) -> str | None:
    """vLLM v0.18+'s context-length 400 text, or None when the request fits."""
    if input_len < context_length and input_len + requested <= context_length:
        return None
    return (f"This model's maximum context length is {context_length} tokens. However, you requested {requested} "
            f"output tokens and your prompt contains {input_len} input tokens, for a total of "
            f"{input_len + requested} tokens. Please reduce the length of the input prompt or the number of "
            f"requested output tokens. (parameter=input_tokens, value={input_len})")


def _check(ctx: ServerContext, parsed: OpenAIRequest, ids: list[int], generation: Generation, rid: str) -> None:
    """The server's checks that need the identified answer; raise `_Refused`."""
    config, flavor, asked = ctx.config, ctx.config.openai_flavor, parsed.sampling.max_tokens
    if flavor == "sglang":
        problem = context_error(len(ids), asked or 0, config.context_length,
                                legacy=config.profile.legacy_context_check)
        if problem is not None:
            raise _Refused(problem, in_band=parsed.stream)
        if parsed.client_id is not None and rid in ctx.state.inflight:
            raise _Refused(f"Duplicate request ID detected: {rid}", in_band=parsed.stream)
    else:
        requested = asked if asked is not None else max(0, config.context_length - len(ids))
        problem = vllm_context_error(len(ids), requested, config.context_length)
        if problem is not None:
            raise _Refused(problem, param="input_tokens")
    if generation.is_error:
        raise _Refused(generation.error_message or "error", generation.error_status or 500, in_band=parsed.stream)


def _choices(ctx: ServerContext, request: web.Request, parsed: OpenAIRequest, base_id: str,
             arrived: float) -> list[Choice]:
    """Identify every (prompt, n) choice; the first refusal stops the request."""
    hint = request.headers.get(TRAJECTORY_HEADER)
    single = len(parsed.prompts) * parsed.sampling.n == 1
    choices: list[Choice] = []
    for ids in parsed.prompts:
        params = parsed.sampling.params(len(ids), ctx.config.context_length)
        for _ in range(parsed.sampling.n):
            rid = base_id if single else uuid.uuid4().hex
            generation = ctx.generate(ids, params, hint)
            record = new_record(ctx, request.path, arrived, rid=rid, stream=parsed.stream, prompt_tokens=len(ids),
                                generation=generation)
            try:
                _check(ctx, parsed, ids, generation, rid)
            except _Refused as refused:
                status = 200 if refused.in_band else refused.status
                for earlier in choices:  # identified, never played: the whole request was refused
                    reject(ctx, earlier.record, status, refused.message, arrived, earlier.generation)
                reject(ctx, record, status, refused.message, arrived, generation)
                raise
            if rid in ctx.state.inflight:  # a client-chosen vLLM request_id already running: keep both apart
                rid = record.rid = uuid.uuid4().hex
            choices.append(Choice(len(choices), ids, generation, rid, record))
    return choices


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def _refuse_in_band(request: web.Request, flavor: str, refused: _Refused) -> web.StreamResponse:
    response = await _open_stream(request)
    await response.write(wire.openai_stream_error(flavor, refused.message, refused.status, param=refused.param))
    await response.write(wire.SSE_DONE)
    await response.write_eof()
    return response


async def _whole(ctx: ServerContext, parsed: OpenAIRequest, choices: list[Choice], formatter: OpenAIFormatter,
                 arrived: float) -> web.Response:
    played = await asyncio.gather(*(play(ctx, choice, arrived) for choice in choices))
    settled = [settle(c.generation, p.count, p.aborted, parsed, ctx.tokenizer) for c, p in zip(choices, played)]
    version = ctx.state.weight_version
    if parsed.kind == "chat":
        return wire.json_response(formatter.chat_body(choices[0].prompt_ids, settled, version))
    if parsed.kind == "completion":
        return wire.json_response(formatter.completion_body(parsed.prompts, settled, version))
    return wire.json_response(formatter.generate_body(settled))


async def _feed(ctx: ServerContext, choice: Choice, arrived: float, queue: asyncio.Queue[Any]) -> None:
    """Play one choice into the stream's queue: (index, tokens so far, None) then (index, None, outcome)."""
    async def on_token(count: int) -> None:
        queue.put_nowait((choice.index, count, None))

    try:
        outcome: Played | Exception = await play(ctx, choice, arrived, on_token)
    except Exception as error:  # surfaced by the writer, which would otherwise wait forever
        outcome = error
    queue.put_nowait((choice.index, None, outcome))


async def _stream(request: web.Request, ctx: ServerContext, parsed: OpenAIRequest, choices: list[Choice],
                  formatter: OpenAIFormatter, arrived: float) -> web.StreamResponse:
    """Every choice plays concurrently; their chunks interleave in the order tokens appear."""
    response = await _open_stream(request)
    queue: asyncio.Queue[tuple[int, int | None, Played | Exception | None]] = asyncio.Queue()
    cursors = [formatter.cursor(settle(c.generation, len(c.generation.output_ids), False, parsed, ctx.tokenizer))
               for c in choices]
    tasks = [asyncio.create_task(_feed(ctx, choice, arrived, queue)) for choice in choices]
    opened, remaining, generated = parsed.kind != "chat", len(choices), 0
    try:
        while remaining:
            index, count, played = await queue.get()
            if isinstance(played, Exception):
                raise played
            choice, chunks = choices[index], []
            if not opened:
                chunks, opened = formatter.role_chunks(choice.prompt_ids), True
            if played is None and count is not None:
                chunks += formatter.token_chunks(index, cursors[index], count, choice.prompt_ids)
            elif played is not None:
                remaining, generated = remaining - 1, generated + played.count
                if played.aborted or played.count == 0:
                    ending = settle(choice.generation, played.count, played.aborted, parsed, ctx.tokenizer)
                    chunks += formatter.close_chunks(index, cursors[index], ending, choice.prompt_ids)
            for chunk in chunks:
                await response.write(wire.sse(chunk))
        if parsed.include_usage:
            prompt_tokens = sum(len(ids) for ids in parsed.prompts)
            await response.write(wire.sse(formatter.usage_chunk(prompt_tokens, generated)))
        await response.write(wire.SSE_DONE)
        await response.write_eof()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return response


async def _serve(request: web.Request, kind: str, parser: Parser) -> web.StreamResponse:
    ctx, arrived = context_of(request), time.time()
    flavor = ctx.config.openai_flavor
    try:
        parsed = parser(decode_body(await request.read()), flavor, ctx.tokenizer)
    except BadRequest as error:
        reject(ctx, new_record(ctx, request.path, arrived), 400, error.message, arrived)
        return wire.openai_error(flavor, error.message, 400, error.err_type, error.param)
    base_id = parsed.client_id or uuid.uuid4().hex
    try:
        choices = _choices(ctx, request, parsed, base_id, arrived)
    except _Refused as refused:
        if refused.in_band:
            return await _refuse_in_band(request, flavor, refused)
        return wire.openai_error(flavor, refused.message, refused.status, param=refused.param)
    response_id = base_id if flavor == "sglang" and kind != "generate" else _PREFIX[kind] + base_id
    formatter = OpenAIFormatter(flavor, parsed, ctx.tokenizer, ctx.config.model_name, response_id)
    if parsed.stream:
        return await _stream(request, ctx, parsed, choices, formatter, arrived)
    return await _whole(ctx, parsed, choices, formatter, arrived)


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
