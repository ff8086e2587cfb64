"""Answer headers that name what the server served: the trajectory, turn, attempt and request id.

The target's worker reads them on every answer (`bench.records.attribution`) to know which trajectory the
code that receives the answer is working for; an exception raised there is then attributed to that
trajectory, not guessed from the fault log. A request carrying several identified trajectories (a
batched `/generate`, an `n > 1` completion) names none: its answer belongs to no single one.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bench.records.attribution import (
    SERVED_ATTEMPT_HEADER,
    SERVED_REQUEST_HEADER,
    SERVED_TRAJECTORY_HEADER,
    SERVED_TURN_HEADER,
)
from bench.records.request_log import RequestRecord

# the request's log records, in the order they were identified (a typed key where aiohttp has them)
SERVED_KEY: Any = web.RequestKey("rollout_bench_served", list) if hasattr(web, "RequestKey") else "rollout_bench_served"


def served_header_pairs(record: RequestRecord) -> list[tuple[str, str]]:
    """The headers naming what one identified record's answer served: its trajectory, turn, attempt and request id."""
    turn, attempt = record.turn, record.attempt
    pairs = [(SERVED_TRAJECTORY_HEADER, str(record.trajectory)),
             (SERVED_TURN_HEADER, "" if turn is None else str(turn)),
             (SERVED_ATTEMPT_HEADER, "" if attempt is None else str(attempt))]
    if record.rid:
        pairs.append((SERVED_REQUEST_HEADER, str(record.rid)))
    return pairs


def add_served_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Name what was served in the answer's headers, before they go out: the generation routes' guard calls it on
    the answer a handler returns, and `prepare` on a stream a handler opens. Not an `on_response_prepare` signal:
    that one is dispatched on every answer of every route."""
    try:  # not `request.get`: a request's mapping methods are the slow generic ones
        records = request[SERVED_KEY]
    except KeyError:
        return
    if len(records) != 1 or records[0].trajectory is None:  # one identified record, or the answer names none
        return
    response.headers.update(served_header_pairs(records[0]))  # each replaced, as setting it one by one would


async def prepare(response: web.StreamResponse, request: web.Request) -> None:
    """`response.prepare(request)` for a stream a generation route opens, its served headers first."""
    add_served_headers(request, response)
    await response.prepare(request)
