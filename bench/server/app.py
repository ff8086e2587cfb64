"""The bench server: an aiohttp application, startable in-process or in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.records.request_log import RequestLog
from bench.replay import TraceStore
from bench.tokenizer import TOKENIZER_NAME, load_tokenizer, tokenizer_path
from bench.trace import TokenizerInfo
from bench.trace.shipped import DEFAULT_TRACE, resolve_trace
from faults import Plan, resolve_plan

from bench.orchestration import collector

from . import native
from .admin import add_admin_routes
from .bench_admin import add_bench_routes
from .context import CONTEXT_KEY, ServerConfig, ServerContext
from .control import CONTROL_TOKEN_KEY, control_token_for
from .http_guard import LIMITS_KEY, PARSER_REFUSALS, GuardedSite, guard_routes, parser_refusal_logger
from .limits import Limits
from .profiles import DEFAULT_PROFILE, get_profile
from .router import add_router_routes


def create_app(ctx: ServerContext, control_token: str | None = None, limits: Limits = Limits()) -> web.Application:
    """The server's routes; with a `control_token`, `/bench/*` refuses requests without it (logged all the same)."""
    app = web.Application(client_max_size=limits.max_body_bytes)  # no middleware: `guard_routes` wraps the routes
    app[CONTEXT_KEY] = ctx
    app[LIMITS_KEY] = limits
    if control_token is not None:
        app[CONTROL_TOKEN_KEY] = control_token
    app[_COLLECTOR_KEY] = []  # the hold taken at startup (the app's state is frozen by then: a list to fill)
    app.on_startup.append(_hold_collector)
    app.on_cleanup.append(_release_collector)
    app.router.add_route("POST", "/generate", native.generate)
    app.router.add_route("PUT", "/generate", native.generate)
    if ctx.upstream is None:
        add_admin_routes(app)
    add_bench_routes(app)
    add_router_routes(app, surface=ctx.upstream is None)
    from .openai_routes import add_openai_routes

    add_openai_routes(app)
    if ctx.upstream is not None:  # everything else is the engine's (admin routes, a router's own), unchanged
        app.router.add_route("*", "/{path:.*}", _forward)
    guard_routes(app, control_token, catch_all=ctx.upstream is None)
    return app


_COLLECTOR_KEY = web.AppKey("collector_hold", list)


async def _hold_collector(app: web.Application) -> None:
    """While it serves: the loaded trace frozen, young collections rare (`collector.SERVING_THRESHOLD`)."""
    app[_COLLECTOR_KEY].append(collector.hold(collector.SERVING_THRESHOLD, freeze=True))


async def _release_collector(app: web.Application) -> None:
    while app[_COLLECTOR_KEY]:
        collector.release(app[_COLLECTOR_KEY].pop())


async def _forward(request: web.Request) -> web.StreamResponse:
    upstream = request.app[CONTEXT_KEY].upstream
    assert upstream is not None
    return await upstream.forward(request)


def load_context(trace: str | Path = DEFAULT_TRACE, *, sglang_version: str = DEFAULT_PROFILE,
                 time_scale: float = 0.0, plan: Plan | str | None = None, groups_of: Collection[str] | None = None,
                 **options: Any) -> ServerContext:
    """Load a trace (and a fault plan: a Plan, a TOML path or a shipped plan name) into a server context;
    `groups_of`: serve only the groups of these trajectories (a repro's). With `upstream=URL` the answers come
    from that live engine instead, the trace giving only the prompts' identities (`bench.server.proxy`)."""
    if options.get("upstream"):
        from .proxy import load_upstream_context

        return load_upstream_context(options.pop("upstream"), trace=trace, sglang_version=sglang_version,
                                     plan=plan, groups_of=groups_of, adapter=True, **options)
    options.pop("upstream", None)
    tokenizer_dir = options.pop("tokenizer_dir", None)
    if time_scale < 0:
        raise ValueError(f"time scale must be >= 0, got {time_scale}")
    store = TraceStore.load(resolve_trace(str(trace)), groups_of=groups_of)
    tokenizer, folder = trace_tokenizer(store.path, store.header.tokenizer, tokenizer_dir)
    config = ServerConfig(profile=get_profile(sglang_version), model=store.header.model,
                          context_length=store.header.context_length, time_scale=time_scale, **options)
    if isinstance(plan, str):
        plan = resolve_plan(plan)
    return ServerContext(config, store, tokenizer, plan, tokenizer_folder=folder)


def trace_tokenizer(path: Path, named: TokenizerInfo, folder: str | None) -> tuple[Any, Path]:
    """The tokenizer a trace's ids are in, and its folder: the bench's own, or (a recording of a real model) the
    local Hugging Face folder given as `--tokenizer DIR`, checked against what the trace's header says."""
    bench = folder is None or Path(folder).resolve() == tokenizer_path().resolve()
    if named.name == TOKENIZER_NAME:
        if not bench:
            raise ValueError(f"trace {path} is in the bench's own tokenizer ({TOKENIZER_NAME}); --tokenizer {folder} "
                             "does not apply to it")
        return load_tokenizer(), tokenizer_path()
    if folder is None:
        raise ValueError(f"trace {path} uses tokenizer {named.name!r}, not the bench's ({TOKENIZER_NAME}): give "
                         "--tokenizer DIR, a local folder of that tokenizer (Hugging Face format), to serve it")
    from bench.capture.upstream import LocalTokenizer, UpstreamError

    try:
        local = LocalTokenizer(folder)
    except UpstreamError as error:
        raise ValueError(str(error)) from None
    if local.vocab_size < named.vocab_size:
        raise ValueError(f"--tokenizer {folder} has {local.vocab_size} tokens but trace {path} says its ids reach "
                         f"{named.vocab_size - 1} (tokenizer {named.name!r}): not the trace's tokenizer")
    return local, Path(folder)


class BenchServer:
    """The mock server on 127.0.0.1; `async with BenchServer(...) as server: server.url`. Bound beyond loopback,
    `/bench/*` requires `control_token` (generated when not given: `server.control_token`)."""

    def __init__(self, trace: str | Path = DEFAULT_TRACE, *, host: str = "127.0.0.1", port: int = 0,
                 context: ServerContext | None = None, control_token: str | None = None, limits: Limits | None = None,
                 spill_dir: Path | None = None, **options: Any) -> None:
        self.control_token = control_token_for(host, control_token)
        self.limits = limits or Limits()
        self.context = context or load_context(trace, **options)
        self.context.limits = self.limits
        if self.limits.keep_requests is not None:  # a long-lived server: log rows beyond it spill to `spill_dir`
            self.context.retain(self.limits.keep_requests, spill_dir)
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None
        self.site: GuardedSite | None = None

    @property
    def url(self) -> str:
        return self.context.url

    @property
    def log(self) -> RequestLog:
        return self.context.log

    async def start(self) -> str:
        self._runner = web.AppRunner(create_app(self.context, self.control_token, self.limits),
                                     handler_cancellation=True, keepalive_timeout=self.limits.head_timeout_s,
                                     # as uvicorn under SGLang and vLLM: a request body is never decompressed (a
                                     # gzip body is not JSON, a 400); aiohttp's decoding could also leave a handler
                                     # waiting on a body whose encoding broke mid-way until the body timeout
                                     auto_decompress=False,
                                     access_log=PARSER_REFUSALS, access_log_class=parser_refusal_logger(self.context))
        await self._runner.setup()
        self.site = GuardedSite(self._runner, self.host, self.port, self.limits.max_connections)
        await self.site.start()
        host, port = self._runner.addresses[0][:2]
        self.port = port
        self.context.url = f"http://{host}:{port}"
        return self.context.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.context.upstream is not None:
            await self.context.upstream.close()

    async def __aenter__(self) -> "BenchServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class ServerThread:
    """A BenchServer on its own event loop in a background thread, for synchronous callers."""

    def __init__(self, trace: str | Path = DEFAULT_TRACE, **options: Any) -> None:
        self.server = BenchServer(trace, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-server", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def context(self) -> ServerContext:
        return self.server.context

    def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the server's loop (e.g. to read state consistently)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        self.call(self.server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self.server.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
