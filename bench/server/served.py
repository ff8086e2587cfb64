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

# the request's log records, in the order they were identified (a typed key where aiohttp has them)
SERVED_KEY: Any = web.RequestKey("rollout_bench_served", list) if hasattr(web, "RequestKey") else "rollout_bench_served"


async def add_served_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: runs before the headers go out, streamed answers included."""
    try:  # not `request.get`: a request's mapping methods are the slow generic ones
        records = request[SERVED_KEY]
    except KeyError:
        return
    if len(records) != 1 or records[0].trajectory is None:  # one identified record, or the answer names none
        return
    record = records[0]
    headers = response.headers
    headers[SERVED_TRAJECTORY_HEADER] = str(record.trajectory)
    headers[SERVED_TURN_HEADER] = "" if record.turn is None else str(record.turn)
    headers[SERVED_ATTEMPT_HEADER] = "" if record.attempt is None else str(record.attempt)
    if record.rid:
        headers[SERVED_REQUEST_HEADER] = str(record.rid)
