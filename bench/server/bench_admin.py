"""Bench controls under the reserved `/bench/` prefix: request log, fault plan, fault log.

`PUT /bench/plan` swaps the fault plan atomically while the server runs, from a TOML text
(`{"toml": "..."}`) or from `--fault` specs (`{"faults": ["missing_logprobs:p=1/400"], "seed": 7}`);
the new plan's time windows count from its own first request (unless it says `window_from = "server_start"`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bench.records.request_log import Evicted
from bench.steps import STEP_ROUTE
from bench.steps.board import step_route
from faults import FaultError, Plan, PlanError, plan_from_specs
from faults.plan import parse_plan

from . import wire
from .context import context_of


def _describe(plan: Plan) -> dict[str, Any]:
    return {"name": plan.name, "seed": plan.seed, "description": plan.description, "window_from": plan.window_from,
            "rules": [rule.describe() for rule in plan.rules]}


_ROWS_PER_WRITE = 2_000


async def requests_log(request: web.Request) -> web.StreamResponse:
    """The request log as a JSON array, every row from `?since=SEQ` (default: the oldest kept) to the latest; rows a
    long-lived server spilled to disk are read back and sent in pieces, so the answer never sits whole in memory. Rows
    dropped (a bounded log without --log-dir) are a 410 naming the first row still kept; the `X-Bench-Log-First-Seq`
    and `X-Bench-Log-Dropped` headers say what the answer starts at and how many rows are gone."""
    log = context_of(request).log
    try:
        since = int(request.query.get("since", log.first_kept))
        if since < 0:
            raise ValueError
    except ValueError:
        return wire.json_response({"error": f"since must be a row number (seq) of at least 0, got "
                                            f"{request.query.get('since')!r}"}, 400)
    try:
        rows = log.rows(since)
    except Evicted as error:
        return wire.json_response({"error": str(error), "first_kept": error.first_kept}, 410)
    headers = {"X-Bench-Log-First-Seq": str(since), "X-Bench-Log-Dropped": str(log.dropped)}
    if not log.chunks and len(log) - since <= _ROWS_PER_WRITE:
        return wire.json_response(list(rows), headers=headers)
    response = web.StreamResponse(headers={**headers, "Content-Type": wire.JSON})
    await response.prepare(request)
    opened = False
    batch: list[bytes] = []
    try:
        for row in rows:
            batch.append(wire.dumps(row))
            if len(batch) >= _ROWS_PER_WRITE:
                await response.write((b"," if opened else b"[") + b",".join(batch))
                opened, batch = True, []
    except Evicted:  # rows dropped while being sent: the array ends where they went
        pass
    await response.write((b"," if opened and batch else b"" if opened else b"[") + b",".join(batch) + b"]")
    await response.write_eof()
    return response


async def fault_log(request: web.Request) -> web.Response:
    """Every fault event kept and the rules that never fired; the `X-Bench-Faults-Dropped` header says how many
    events a bounded log dropped (a long-lived server without --log-dir: `SpilledFaultLog`), as `/bench/requests`
    does for its rows."""
    engine = context_of(request).faults
    dropped = getattr(engine.log, "dropped", 0)  # a run's log keeps every event
    return wire.json_response({"events": engine.log.as_dicts(), "never_fired": engine.never_fired()},
                              headers={"X-Bench-Faults-Dropped": str(dropped)})


async def get_plan(request: web.Request) -> web.Response:
    return wire.json_response(_describe(context_of(request).faults.plan))


def _plan_from_body(body: Any) -> Plan:
    if not isinstance(body, dict):
        raise PlanError('expected {"toml": "<plan text>"} or {"faults": ["<spec>", ...], "seed": N}')
    if "toml" in body:
        return parse_plan(str(body["toml"]), "<request body>", default_name="runtime")
    faults = body.get("faults")
    seed = body.get("seed", 0)
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise PlanError('"faults" must be a list of fault specs like "missing_logprobs:p=1/400"')
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PlanError(f'"seed" must be an integer, got {seed!r}')
    return plan_from_specs(faults, seed, str(body.get("name", "runtime")))


async def put_plan(request: web.Request) -> web.Response:
    try:
        plan = _plan_from_body(wire.decode_json(await request.read()))
    except wire.NotJson:
        return wire.json_response({"error": "request body is not JSON"}, 400)
    except (PlanError, FaultError) as error:
        return wire.json_response({"error": str(error)}, 400)
    old = context_of(request).faults.swap(plan)
    return wire.json_response({"plan": _describe(plan), "replaced": old.name})


def add_bench_routes(app: web.Application) -> None:
    app.router.add_get("/bench/requests", requests_log)
    app.router.add_get("/bench/faults", fault_log)
    app.router.add_get("/bench/plan", get_plan)
    app.router.add_put("/bench/plan", put_plan)
    app.router.add_post("/bench/plan", put_plan)
    app.router.add_post(STEP_ROUTE, step_route)  # a multi-step run's worker reports each step's end
