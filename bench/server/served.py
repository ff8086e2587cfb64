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
    records = request.get(SERVED_KEY) or []
    identified = {r.trajectory for r in records if r.trajectory is not None}
    if len(identified) != 1 or len(records) != 1:
        return
    record = records[0]
    response.headers[SERVED_TRAJECTORY_HEADER] = str(record.trajectory)
    response.headers[SERVED_TURN_HEADER] = str(record.turn if record.turn is not None else "")
    response.headers[SERVED_ATTEMPT_HEADER] = str(record.attempt if record.attempt is not None else "")
    if record.rid:
        response.headers[SERVED_REQUEST_HEADER] = str(record.rid)
