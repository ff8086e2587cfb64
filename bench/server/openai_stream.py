"""Playing OpenAI choices under their faults, and writing their event streams.

A request's choices share one HTTP answer, so the wire-level faults (content type, broken
JSON, NaN, truncation, a cut stream) of the first choice that has any speak for all of them;
per-choice faults (first-token delay, queued abort, what the choice shows) stay per choice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from faults import Exchange

from . import served, transport, wire
from .context import ServerContext
from .openai_answer import settle
from .openai_format import OpenAIFormatter
from .openai_request import OpenAIRequest
from .playback import Choice, OnToken, Played, play, reject


def wire_faults(exchanges: list[Exchange]) -> Exchange:
    """The exchange whose wire-level faults the whole answer carries."""
    for exchange in exchanges:
        t = exchange.transport
        if (exchange.content_type or exchange.corrupt_json or exchange.allow_nan or t.truncate_at is not None
                or t.cut_after_chunks is not None):
            return exchange
    return exchanges[0]


async def play_choice(ctx: ServerContext, choice: Choice, exchange: Exchange, arrived: float,
                      on_token: OnToken | None = None) -> Played:
    """Play one choice after its first-token delay; a queued abort never reaches the engine."""
    await asyncio.sleep(exchange.transport.first_token_delay)
    if exchange.queued_abort:
        reject(ctx, choice.record, 200, "aborted in the waiting queue", arrived, choice.generation)
        choice.record.finish, choice.record.completion_tokens = "abort", 0
        return Played(0, aborted=True, queued=True)
    return await play(ctx, choice, arrived, on_token)


class StreamCut(Exception):
    """A fault ended the stream early; `drop`: the connection dies, else `done` says if `[DONE]` follows."""

    def __init__(self, drop: bool, done: bool = False) -> None:
        super().__init__()
        self.drop, self.done = drop, done


class EventWriter:
    """Writes `data:` events as the stream's faults say: bare NaN, one cut JSON event, a cut or torn end."""

    def __init__(self, response: web.StreamResponse, exchange: Exchange, tokens: int) -> None:
        self.response = response
        self.exchange = exchange
        self.events = 0
        self.corrupt = exchange.corrupt_json
        keep = exchange.transport.truncate_at  # truncated_body: `keep` of the events, then half of the next
        self.truncate_after = None if keep is None else int(max(1, tokens) * keep)

    async def send(self, chunk: dict[str, Any]) -> None:
        t = self.exchange.transport
        if t.cut_after_chunks is not None and self.events >= t.cut_after_chunks:
            raise StreamCut(drop=t.reset, done=t.done_after_cut)
        body = transport.encode(chunk, self.exchange, corrupt=self.corrupt)
        self.corrupt = False  # one broken event is enough
        await self._write(b"data: " + body + b"\n\n")

    async def close(self) -> None:
        await self._write(wire.SSE_DONE)
        await self.response.write_eof()

    async def _write(self, event: bytes) -> None:
        if self.truncate_after is not None and self.events >= self.truncate_after:
            await self.response.write(event[: len(event) // 2])
            raise StreamCut(drop=True)
        await self.response.write(event)
        self.events += 1


async def _feed(ctx: ServerContext, choice: Choice, exchange: Exchange, arrived: float,
                queue: asyncio.Queue[Any]) -> None:
    """Play one choice into the stream's queue: (index, tokens so far, None) then (index, None, outcome)."""
    async def on_token(count: int) -> None:
        queue.put_nowait((choice.index, count, None))

    try:
        outcome: Played | Exception = await play_choice(ctx, choice, exchange, arrived, on_token)
    except Exception as error:  # surfaced by the writer, which would otherwise wait forever
        outcome = error
    queue.put_nowait((choice.index, None, outcome))


async def stream_choices(request: web.Request, ctx: ServerContext, parsed: OpenAIRequest, choices: list[Choice],
                         exchanges: list[Exchange], formatter: OpenAIFormatter, arrived: float) -> web.StreamResponse:
    """Every choice plays concurrently; their chunks interleave in the order tokens appear."""
    carrier = wire_faults(exchanges)
    response = web.StreamResponse(status=200, headers={"Content-Type": carrier.content_type or "text/event-stream"})
    await served.prepare(response, request)
    writer = EventWriter(response, carrier, max(len(c.generation.output_ids) for c in choices))
    queue: asyncio.Queue[tuple[int, int | None, Played | Exception | None]] = asyncio.Queue()
    tasks = [asyncio.create_task(_feed(ctx, c, e, arrived, queue)) for c, e in zip(choices, exchanges)]
    try:
        await _write_choices(ctx, parsed, choices, exchanges, formatter, writer, queue)
    except StreamCut as cut:
        await _stop(tasks)
        for choice in choices:  # the client saw a 200 whose choices never (visibly) finished
            record = choice.record
            record.status, record.client_disconnected, record.error = 200, False, "stream cut by a fault"
            ctx.identifier.record_outcome(choice.generation.identity, succeeded=False)
        if cut.drop:
            return transport.drop_connection(request)
        if cut.done:
            await response.write(wire.SSE_DONE)
        await response.write_eof()
    finally:
        await _stop(tasks)
    return response


async def _write_choices(ctx: ServerContext, parsed: OpenAIRequest, choices: list[Choice], exchanges: list[Exchange],
                         formatter: OpenAIFormatter, writer: EventWriter, queue: asyncio.Queue[Any]) -> None:
    finals = [settle(c.generation, len(c.generation.output_ids), False, parsed, ctx.tokenizer, e)
              for c, e in zip(choices, exchanges)]
    cursors = [formatter.cursor(final) for final in finals]
    opened, remaining, generated = parsed.kind != "chat", len(choices), 0
    while remaining:
        index, count, played = await queue.get()
        if isinstance(played, Exception):
            raise played
        choice, chunks = choices[index], []
        if not opened:
            chunks, opened = formatter.role_chunks(choice.prompt_ids, finals), True
        if played is None and count is not None:
            chunks += formatter.token_chunks(index, cursors[index], count, choice.prompt_ids)
        elif played is not None:
            remaining, generated = remaining - 1, generated + played.count
            if played.aborted or played.count == 0:
                ending = settle(choice.generation, played.count, played.aborted, parsed, ctx.tokenizer,
                                exchanges[index])
                chunks += formatter.close_chunks(index, cursors[index], ending, choice.prompt_ids)
        for chunk in chunks:
            await writer.send(chunk)
    if parsed.include_usage:
        prompt_tokens = sum(len(ids) for ids in parsed.prompts)
        await writer.send(formatter.usage_chunk(prompt_tokens, generated))
    await writer.close()


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
