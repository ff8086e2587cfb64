"""Bench controls under the reserved `/bench/` prefix: request log, fault plan, fault log.

`PUT /bench/plan` swaps the fault plan atomically while the server runs, from a TOML text
(`{"toml": "..."}`) or from `--fault` specs (`{"faults": ["missing_logprobs:p=1/400"], "seed": 7}`);
the new plan's time windows count from its own first request (unless it says `window_from = "server_start"`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bench.steps import STEP_ROUTE
from bench.steps.board import step_route
from faults import FaultError, Plan, PlanError, plan_from_specs
from faults.plan import parse_plan

from . import wire
from .context import context_of


def _describe(plan: Plan) -> dict[str, Any]:
    return {"name": plan.name, "seed": plan.seed, "description": plan.description, "window_from": plan.window_from,
            "rules": [rule.describe() for rule in plan.rules]}


async def requests_log(request: web.Request) -> web.Response:
    return wire.json_response(context_of(request).log.as_dicts())


async def fault_log(request: web.Request) -> web.Response:
    engine = context_of(request).faults
    return wire.json_response({"events": engine.log.as_dicts(), "never_fired": engine.never_fired()})


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
