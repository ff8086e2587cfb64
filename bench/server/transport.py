"""Transport faults on a real aiohttp connection: resets, truncated bodies, cut streams, stalls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from faults import Exchange, Replacement

from . import served, wire
from .state import ServerState


def drop_connection(request: web.Request) -> web.StreamResponse:
    """Close the socket at once, no answer; the returned response is never sent."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError  # aiohttp treats the request as abandoned, not as a server error


def encode(obj: Any, exchange: Exchange | None, *, corrupt: bool | None = None) -> bytes:
    """JSON bytes of a body, honouring NaN (bare `NaN`) and cut-JSON faults.

    `corrupt` overrides the exchange's `corrupt_json` (a stream breaks only one event).
    """
    if exchange is not None and exchange.allow_nan:
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    else:
        body = wire.dumps(obj)
    if corrupt if corrupt is not None else (exchange is not None and exchange.corrupt_json):
        body = corrupted(body)
    return body


def corrupted(body: bytes) -> bytes:
    """A `malformed_json` body: cut in the middle."""
    return body[: max(1, len(body) // 2)]


def replacement_response(replacement: Replacement) -> web.Response:
    response = web.Response(body=replacement.body, status=replacement.status, headers=replacement.headers)
    if replacement.content_type is None:
        response.headers.pop("Content-Type", None)
    else:
        response.content_type = replacement.content_type
    return response


async def send_body(request: web.Request, body: bytes, exchange: Exchange | None,
                    content_type: str = wire.JSON) -> web.StreamResponse:
    """Send a whole JSON body, or only part of it when a `truncated_body` fault says so."""
    if exchange is not None and exchange.content_type:
        content_type = exchange.content_type
    keep = exchange.transport.truncate_at if exchange is not None else None
    if keep is None:
        return web.Response(body=body, content_type=content_type)
    response = web.StreamResponse(headers={"Content-Type": content_type})
    response.content_length = len(body)
    await served.prepare(response, request)
    await response.write(body[: int(len(body) * keep)])
    return drop_connection(request)


async def wait_before_answer(exchange: Exchange, state: ServerState) -> None:
    """Latency and stall faults: nothing is sent meanwhile (a stalled client gives up first). A hold for a newer
    policy (`until_version`) ends when the server's weight version gets there, when nothing else has generated
    for `until_idle_s`, or after `delay` at the latest."""
    carrier = exchange.transport
    if carrier.until_version is not None:
        await state.wait_for_version(carrier.until_version, carrier.delay, carrier.until_idle_s)
    elif exchange.transport.delay > 0:
        await asyncio.sleep(exchange.transport.delay)


def cut_at(encoded: bytes, found: list[tuple[int, int, bytes]]) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """A saved reply cut where its per-request values go: `found` holds (position, slot, marker) of each marker
    once; the pieces around them in order, and which slot follows each piece (the fast paths splice them in)."""
    found = sorted(found)
    pieces, at = [], 0
    for position, _, marker in found:
        pieces.append(encoded[at:position])
        at = position + len(marker)
    pieces.append(encoded[at:])
    return tuple(pieces), tuple(slot for _, slot, _ in found)


def instant(ttft: float, total: float, time_scale: float) -> bool:
    """Whether an answer has nothing to wait at this time scale: what `play` waits is the time to first token, then
    the decode time, both scaled."""
    return ttft * time_scale <= 0 and max(0.0, total - ttft) * time_scale <= 0
