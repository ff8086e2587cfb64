"""Between the socket and the routes: every request is read within its limits and logged, whatever becomes of it.

- `/bench/*` without the control token is refused first, from the head alone (its body is never read).
- The body is read here, first, within `Limits.body_timeout_s` and `Limits.max_body_mb`: a body too slow (408), too
  big (413) or unreadable (a broken chunked stream: 400) is answered in FastAPI's JSON shape with a request-log row,
  and routes read the cached bytes. Bodies are taken as sent, never decompressed, as the engines' uvicorn does.
- Requests outside the generation routes are logged here (those log themselves, with their identity); what no route
  takes is FastAPI's 404/405 JSON.
- It wraps each route's handler (`guard_routes`, once at startup), not the app as a middleware: see there why.
- What aiohttp's own HTTP parser refuses never reaches the app: an access logger logs those rows.
- `GuardedSite` listens with a connection limit; aiohttp's keep-alive timeout closes a head that never completes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_request import BaseRequest

from bench.records.attribution import SERVED_TRAJECTORY_HEADER
from bench.records.request_log import RequestRecord

from . import wire
from .context import CONTEXT_KEY, ServerContext
from .control import token_matches, token_refusal
from .limits import ConnectionGuard, Limits
from .router import GENERATION_ROUTES, no_workers
from .served import add_served_headers

LIMITS_KEY = web.AppKey("limits", Limits)
ROUTED_KEY = web.RequestKey("rollout_bench_routed", bool)  # set on every request the app routes
PARSER_REFUSALS = logging.getLogger("rollout_bench.parser_refusals")  # handed to aiohttp, never written to


def parser_refusal_logger(ctx: ServerContext) -> type[AbstractAccessLogger]:
    """An access logger that logs only what never reached the app: requests aiohttp's HTTP parser refused and
    answered itself (a body that does not decode under its Content-Encoding, a malformed head)."""

    class RefusedByParser(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: web.StreamResponse, time_s: float) -> None:
            if request.get(ROUTED_KEY):
                return
            answer = response.body if isinstance(response, web.Response) and isinstance(response.body, bytes) else b""
            ctx.log.append(RequestRecord(
                started=round(time.time() - time_s, 6),
                endpoint=request.path if request.method != "UNKNOWN" else "(unparsed)", status=response.status,
                latency_s=round(time_s, 6),
                error=f"refused by the HTTP parser: {answer.decode('utf-8', 'replace').strip()[:200]}"))

    return RefusedByParser


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_routes(app: web.Application, control_token: str | None = None, catch_all: bool = True) -> None:
    """Put every route of `app` behind the guard, once, at startup (call it after the last route is added): a
    wrapper per handler instead of an app middleware, because any middleware makes aiohttp build a middleware chain
    and add its own current-app layer on every request. Unless a route already takes every path (upstream mode's
    forwarding: `catch_all` False), a catch-all route registered last answers what no route takes (404, 405 with the allowed methods)
    behind the same guard. With a `control_token`, `/bench/*` paths need it (checked on the request's path, as
    before the route runs)."""
    if catch_all:
        app.router.add_route("*", "/{tail:.*}", _unmatched)
    for route in app.router.routes():
        resource = route.resource
        path = resource.canonical if resource is not None else ""
        # aiohttp keeps a route's handler in `_handler` (what `route.handler` returns): replaced once, before serving
        if path in GENERATION_ROUTES:
            route._handler = _guard_generation(route.handler, app[CONTEXT_KEY], app[LIMITS_KEY])  # type: ignore[attr-defined]
        else:
            route._handler = _guard_logged(route.handler, control_token, app[LIMITS_KEY])  # type: ignore[attr-defined]


def _guard_generation(handler: Handler, ctx: ServerContext, limits: Limits) -> Handler:
    """A generation route: the body read within the limits, the router's worker present; the route logs itself, and
    its answer names what was served (`served.add_served_headers`; a stream it opens does that itself)."""

    async def generation(request: web.Request) -> web.StreamResponse:
        request[ROUTED_KEY] = True
        arrived = time.time()
        if request.body_exists:
            refusal = await _read_body(request, limits)
            if refusal is not None:
                return _refused(request, arrived, refusal)
        if not ctx.state.workers_available:  # the bench took the router's only worker away
            ctx.log.append(RequestRecord(
                started=arrived, endpoint=request.path, status=503, latency_s=round(time.time() - arrived, 6),
                error="the router has no available workers (taken away by POST /bench/workers)"))
            return await no_workers(request)
        try:
            response = await handler(request)
            if not response.prepared and SERVED_TRAJECTORY_HEADER not in response.headers:  # else named already
                add_served_headers(request, response)
            return response
        except Exception as error:  # a bug: the log says so (the route may not have logged yet); aiohttp answers 500
            ctx.log.append(RequestRecord(
                started=arrived, endpoint=request.path, status=500, latency_s=round(time.time() - arrived, 6),
                error=f"{type(error).__name__}: {error}"))
            if request.writer.output_size > 0:  # a stream already under way: aiohttp drops the connection
                raise
            # aiohttp's own 500 (its body, its log line, the connection closed), made here, where the request's
            # served headers can still be added to it
            response = request.protocol.handle_error(request, 500, error)
            add_served_headers(request, response)
            return response

    return generation


def _guard_logged(handler: Handler, control_token: str | None, limits: Limits) -> Handler:
    """Any other route (and the catch-all): the body read within the limits, a request-log row, FastAPI's JSON for
    a 404 or 405, the control token on `/bench/*` when there is one."""

    async def logged(request: web.Request) -> web.StreamResponse:
        request[ROUTED_KEY] = True
        arrived = time.time()
        if control_token is not None and request.path.startswith("/bench/") and not token_matches(
                request, control_token):  # from the head alone: a body without the token is never read or waited for
            refused = token_refusal(request)
            request.app[CONTEXT_KEY].log.append(RequestRecord(
                started=arrived, endpoint=request.path, status=refused.status,
                latency_s=round(time.time() - arrived, 6), error="no control token (or a wrong one) for /bench/*"))
            return refused
        if request.body_exists:
            refusal = await _read_body(request, limits)
            if refusal is not None:
                return _refused(request, arrived, refusal)
        record = RequestRecord(started=arrived, endpoint=request.path)
        request.app[CONTEXT_KEY].log.append(record)
        try:
            response: web.StreamResponse = await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as error:
            record.status = error.status
            headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
            return wire.json_response({"detail": error.reason}, error.status, headers=headers)
        except web.HTTPException as error:
            record.status = error.status
            raise
        except asyncio.CancelledError:
            record.client_disconnected = True
            raise
        except Exception as error:  # a bug: the log says so, and aiohttp still answers 500 with the traceback logged
            record.status, record.error = 500, f"{type(error).__name__}: {error}"
            raise
        finally:
            record.latency_s = round(time.time() - arrived, 6)
        record.status = response.status
        return response

    return logged


async def _unmatched(request: web.Request) -> web.StreamResponse:
    """What no other route takes: 405 with the methods the path's routes allow (as aiohttp's router says it), else
    404."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not request.match_info.route.resource:
            allowed |= (await resource.resolve(request))[1]
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


def _refused(request: web.Request, arrived: float, refusal: tuple[int, str, web.Response]) -> web.Response:
    status, error, response = refusal
    request.app[CONTEXT_KEY].log.append(RequestRecord(started=arrived, endpoint=request.path, status=status,
                                                      error=error, latency_s=round(time.time() - arrived, 6)))
    return response


async def _read_body(request: web.Request, limits: Limits) -> tuple[int, str, web.Response] | None:
    """Read (and cache) the body within the limits; (status, log error, answer) when that fails."""
    try:
        if request.content.is_eof():  # all of it arrived with the head (the usual case): no wait, so no timer to arm
            await request.read()
        else:
            async with asyncio.timeout(limits.body_timeout_s):
                await request.read()
    except TimeoutError:
        message = f"the request body did not arrive within {limits.body_timeout_s:g} s"
        return 408, message, wire.json_response({"detail": message}, 408)
    except web.HTTPRequestEntityTooLarge:
        message = f"the request body is larger than the server's limit of {limits.max_body_mb:g} MB"
        return 413, message, wire.json_response({"detail": message}, 413)
    except RequestPayloadError as error:
        message = f"There was an error parsing the body: {error}"
        return 400, f"unreadable body: {error}", wire.json_response({"detail": message}, 400)
    return None


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass a `ConnectionGuard` (at most `limit` open at once)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limit: int) -> None:
        super().__init__(runner)
        self._host, self._port, self._limit = host, port, limit
        self.guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self.guard = ConnectionGuard(server, self._limit)
        self._server = await asyncio.get_running_loop().create_server(self.guard, self._host, self._port,
                                                                       reuse_address=True)
