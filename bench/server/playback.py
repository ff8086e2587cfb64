"""One generation played in time, for every API (native items and OpenAI choices alike).

Each generation is identified on its own, registered in flight under its own rid (so
`/abort_request` and `/pause_generation` reach it), paced by the recorded time to first
token and per-token time scaled by `time_scale`, logged as a RequestRecord, and its
outcome reported to the identifier so a retry is matched to the attempt that failed.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

from bench.records.request_log import RequestRecord
from bench.records.served_tokens import PackedAnswer
from bench.replay import Generation, Identity, pack
from faults import Exchange

from .context import ServerContext
from .served import SERVED_KEY
from .state import Pacer

OnToken = Callable[[int], Awaitable[None]]


@dataclass
class Choice:
    index: int
    prompt_ids: list[int]
    generation: Generation
    rid: str
    record: RequestRecord
    exchange: Exchange | None = None  # what faults changed in the answer (its logprobs, its reported version)
    logprobs_requested: bool = False
    packed: PackedAnswer | None = None  # the whole answer's served tokens, converted once (the fast path's)


@dataclass(frozen=True)
class Played:
    count: int  # tokens generated
    aborted: bool
    queued: bool = False  # aborted before its first token: SGLang's reduced body shape


def new_record(ctx: ServerContext, endpoint: str, arrived: float, *, rid: str | None = None, stream: bool = False,
               prompt_tokens: int | None = None, request: web.Request | None = None) -> RequestRecord:
    """Append a log record (`identified` then says what the request was taken to be); with `request`, its
    answer's headers name what was served (`served_headers`)."""
    record = RequestRecord(started=arrived, endpoint=endpoint, rid=rid, stream=stream, prompt_tokens=prompt_tokens)
    ctx.log.append(record)
    if request is not None:
        try:  # not `setdefault`: a request's mapping methods are the slow generic ones
            request[SERVED_KEY].append(record)
        except KeyError:
            request[SERVED_KEY] = [record]
    return record


def logged_identified(ctx: ServerContext, endpoint: str, arrived: float, rid: str, identity: Identity,
                      prompt_tokens: int) -> RequestRecord:
    """`new_record` then the record fields `identified_as` sets, in one positional construction (the fast paths log
    a request once it is identified: nothing between its arrival and then reads or writes the log)."""
    record = RequestRecord(arrived, endpoint, rid, identity.trajectory, identity.group, identity.turn, identity.attempt,
                           identity.drift, identity.by_order, False, None, prompt_tokens)
    ctx.log.append(record)
    return record


def identified(ctx: ServerContext, record: RequestRecord, generation: Generation, prompt_ids: list[int]) -> None:
    """Log the trajectory, turn and attempt the request was taken to be; when it is a trajectory's turn, keep
    what it will be served (`served_tokens`)."""
    identified_as(ctx, record, generation.identity, prompt_ids)


def identified_as(ctx: ServerContext, record: RequestRecord, identity: Identity, prompt: list[int] | bytes,
                  prompt_digest: bytes | None = None) -> None:
    """`identified`, from the identity itself (`prompt`: the ids, or already packed as int32 bytes; `prompt_digest`:
    its digest, when known)."""
    record.trajectory, record.group, record.turn = identity.trajectory, identity.group, identity.turn
    record.attempt, record.drift, record.by_order = identity.attempt, identity.drift, identity.by_order
    if record.trajectory is not None:
        ctx.served.begin(record, prompt if isinstance(prompt, bytes) else pack(prompt), prompt_digest)


def served_logprobs(choice: Choice, count: int) -> list[float | None] | None:
    """The logprob the answer showed for each of the first `count` tokens (None: none shown for it);
    None when the answer carried no logprobs at all."""
    exchange = choice.exchange
    if not choice.logprobs_requested or (exchange is not None and exchange.omit_logprobs):
        return None
    if exchange is not None and exchange.logprob_entries is not None:
        return [lp for lp, _ in exchange.logprob_entries[:count]]
    return list(choice.generation.logprobs or [])[:count]


def entry_stream(choice: Choice, count: int, shown: list[float | None] | None
                 ) -> tuple[list[int], list[float | None]] | None:
    """The (ids, logprobs) of the answer's logprob entries when a fault made them disagree with its token ids
    (`logprob_length_mismatch`): clients that read tokens from the entries (slime does) hold these. `shown`:
    the answer's logprobs (`served_logprobs`), None when it carried none."""
    exchange = choice.exchange
    if exchange is None or exchange.logprob_entries is None or shown is None:
        return None
    whole = count >= len(choice.generation.output_ids)
    entries = exchange.logprob_entries if whole else exchange.logprob_entries[:count]
    ids = [token for _, token in entries]
    if ids == choice.generation.output_ids[:count]:
        return None
    return ids, [logprob for logprob, _ in entries]


def _keep_served(ctx: ServerContext, choice: Choice, count: int) -> None:
    if choice.packed is not None and count == len(choice.packed.ids):
        ctx.served.finish_packed(choice.record, choice.prompt_ids, choice.packed, ctx.state.weight_version)
        return
    exchange = choice.exchange
    version: str | None = ctx.state.weight_version
    if exchange is not None:
        version = None if exchange.omit_weight_version else exchange.reported_weight_version or version
    shown = served_logprobs(choice, count)
    ctx.served.finish(choice.record, choice.prompt_ids, choice.generation.output_ids[:count], shown, version,
                      entry_stream(choice, count, shown))


def reject(ctx: ServerContext, record: RequestRecord, status: int, error: str, arrived: float,
           generation: Generation | None = None) -> None:
    """Log a request answered with an error; an identified attempt counts as failed."""
    record.status, record.error = status, error
    record.latency_s = round(time.time() - arrived, 6)
    if generation is not None:
        ctx.identifier.record_outcome(generation.identity, succeeded=False)


def upstream_failed(ctx: ServerContext, record: RequestRecord, identity: Identity, status: int, arrived: float) -> None:
    """Upstream mode: the engine answered an error (passed on as it came, unfaulted): log the attempt failed."""
    assert ctx.upstream is not None
    record.trajectory, record.group, record.turn = identity.trajectory, identity.group, identity.turn
    record.attempt, record.by_order = identity.attempt, identity.by_order
    reject(ctx, record, status, f"upstream answered {status}", arrived)
    ctx.upstream.record_outcome(identity, succeeded=False)


def _finish(ctx: ServerContext, choice: Choice, arrived: float, count: int, aborted: bool,
            queued: bool = False) -> Played:
    record, generation = choice.record, choice.generation
    finish = "abort" if aborted else (generation.finish_reason or {}).get("type")
    record.status, record.completion_tokens, record.finish = 200, count, finish
    record.latency_s = round(time.time() - arrived, 6)
    ctx.identifier.record_outcome(generation.identity, succeeded=finish in ("stop", "length"))
    return Played(count, aborted, queued)


def played_at_once(ctx: ServerContext, record: RequestRecord, identity: Identity, rid: str, prompt_ids: list[int],
                   answer: PackedAnswer, finish: str | None, arrived: float) -> bool:
    """`play` of a whole answer with no time to wait (unpaced, or recorded as instant), done at once: the same record,
    outcome, in-flight bookkeeping and served tokens, without a coroutine, a pacer or an in-flight entry (nothing
    runs between its registration and its release, so none can be seen or aborted). False while generation is
    paused: `play` waits for it to continue."""
    state = ctx.state
    if state.paused:
        return False
    record.status, record.completion_tokens, record.finish = 200, len(answer.ids), finish
    record.latency_s = round(time.time() - arrived, 6)
    ctx.identifier.record_outcome(identity, succeeded=finish in ("stop", "length"))
    state.inflight.pop(rid, None)  # `register` then `release`: an entry of the same rid is gone too
    state.last_generation = time.monotonic()  # as `register` and `release` (nothing runs between them to read it)
    ctx.served.finish_packed(record, prompt_ids, answer, state.weight_version)
    return True


async def play(ctx: ServerContext, choice: Choice, arrived: float, on_token: OnToken | None = None) -> Played:
    """Wait out the choice's timing; with `on_token`, announce each token as it is produced."""
    generation = choice.generation
    entry = ctx.state.register(choice.rid, generation.identity)
    pacer = Pacer(ctx.state, entry)
    scale = ctx.config.time_scale
    total = len(generation.output_ids)
    decode = max(0.0, generation.total - generation.ttft) * scale
    served = 0  # tokens played so far: what the client was (or is being) served
    try:
        if on_token is None and generation.ttft * scale <= 0 and decode <= 0 and not entry.aborted \
                and not ctx.state.paused:
            # unpaced, as both `pacer.sleep(0)` below would find it: nothing to wait for
            pacer.first_token()
            served = total
            return _finish(ctx, choice, arrived, total, False)
        if not await pacer.sleep(generation.ttft * scale):
            return _finish(ctx, choice, arrived, 0, True, queued=True)
        pacer.first_token()
        if on_token is None:
            started = pacer.active
            if await pacer.sleep(decode):
                served = total
                return _finish(ctx, choice, arrived, total, False)
            per_token = decode / max(1, total)
            done = total if per_token == 0 else math.floor((pacer.active - started) / per_token)
            served = min(done, max(0, total - 1))
            return _finish(ctx, choice, arrived, served, True)
        for count in range(1, total + 1):
            if count > 1 and not await pacer.sleep(decode / total):
                return _finish(ctx, choice, arrived, count - 1, True)
            await on_token(count)
            served = count
        return _finish(ctx, choice, arrived, total, False)
    except (asyncio.CancelledError, ConnectionResetError):
        choice.record.client_disconnected = True
        choice.record.latency_s = round(time.time() - arrived, 6)
        ctx.identifier.record_outcome(generation.identity, succeeded=False)
        raise
    finally:
        ctx.state.release(choice.rid)
        _keep_served(ctx, choice, served)
