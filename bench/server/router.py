"""The sglang-router surface, so clients written against a router work against the bench directly.

`GET /workers` (0.3.2 shape) and `GET /list_workers` (<=0.2.x) list the server itself as the
only worker. `POST /bench/workers {"available": false}` takes that worker away: generation
routes then answer the router's no-available-workers 503, byte for byte (WIRE.md 4.4).
"""

from __future__ import annotations

import random
import uuid
from aiohttp import web

from faults.catalogue.router_no_workers import no_workers_answer, router_request_id

from . import transport, wire
from .context import CONTEXT_KEY, context_of

GENERATION_ROUTES = ("/generate", "/v1/chat/completions", "/v1/completions", "/inference/v1/generate")
WORKER_ID = str(uuid.UUID(int=0x5EED))


async def workers(request: web.Request) -> web.Response:
    ctx = context_of(request)
    worker = {"id": WORKER_ID, "url": ctx.url, "model_id": ctx.config.model, "priority": 50, "cost": 1.0,
              "worker_type": "regular", "is_healthy": ctx.state.workers_available, "load": len(ctx.state.inflight),
              "connection_mode": "HTTP", "metadata": {}, "disable_health_check": False}
    return wire.json_response({"workers": [worker], "total": 1,
                               "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 1}})


async def list_workers(request: web.Request) -> web.Response:
    return wire.json_response({"urls": [context_of(request).url]})


async def readiness(request: web.Request) -> web.Response:
    if context_of(request).state.workers_available:
        return wire.json_response({"status": "ready", "healthy_workers": 1, "total_workers": 1})
    return wire.json_response({"status": "not ready", "reason": "insufficient healthy workers"}, 503)


async def set_workers(request: web.Request) -> web.Response:
    """Bench control: make the router surface lose (or regain) its only worker."""
    try:
        body = wire.decode_json(await request.read() or b"{}")
    except wire.NotJson as error:
        return wire.json_response({"error": f"request body is not JSON: {error}"}, 400)
    if not isinstance(body, dict) or not isinstance(body.get("available"), bool):
        return wire.json_response({"error": 'expected {"available": true|false}'}, 400)
    context_of(request).state.workers_available = body["available"]
    return wire.json_response({"available": body["available"]})


async def no_workers(request: web.Request) -> web.Response:
    """A generation route's answer while the worker is taken away (the request guard asks `workers_available` first,
    `http_guard.guard_routes`: one layer on every generation request, not two)."""
    ctx = request.app[CONTEXT_KEY]
    await request.read()
    return transport.replacement_response(no_workers_answer(ctx.config.router_version,
                                                            router_request_id(random.Random())))


def add_router_routes(app: web.Application, surface: bool = True) -> None:
    """The router's routes (`surface`: False in upstream mode, where the engine's own answer them) and the
    bench's control over its only worker, which also holds in front of a live engine."""
    if surface:
        app.router.add_get("/workers", workers)
        app.router.add_get("/list_workers", list_workers)
        app.router.add_get("/readiness", readiness)
    app.router.add_post("/bench/workers", set_workers)
