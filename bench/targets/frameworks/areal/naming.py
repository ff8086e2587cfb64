"""Names the trajectory on every request AReaL's engine sends (imported in AReaL's environment).

AReaL posts `/generate` through one shared `aiohttp.ClientSession` per executor thread
(`areal.infra.workflow_context.get_aiohttp_session`) and has no hook for request headers. aiohttp's
own tracing does: an `on_request_start` callback sees the request's header dict before it is sent.
The adapter appends one such `TraceConfig` to that session (`ClientSession.trace_configs`, the public
list the session reads on every request) and runs each episode under `episode_scope(trajectory)`; the
callback then adds `X-Bench-Trajectory`, so the server identifies every request (group members'
identical first turns included) exactly, and fault decisions are exact at any concurrency.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import aiohttp

from bench.records.attribution import TRAJECTORY_HEADER, trajectory_scope

_EPISODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("rollout_bench_areal_episode", default=None)


async def _name_request(session: Any, context: Any, params: Any) -> None:
    trajectory = _EPISODE.get()
    if trajectory is not None and params.url.path.endswith("/generate"):
        params.headers[TRAJECTORY_HEADER] = trajectory


def _trace_config() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_name_request)
    config.freeze()
    return config


_NAMING = _trace_config()


def name_requests_of(session: aiohttp.ClientSession) -> None:
    """Make `session` (AReaL's shared one) name the trajectory on each `/generate` (once per session)."""
    if _NAMING not in session.trace_configs:
        session.trace_configs.append(_NAMING)


@contextlib.contextmanager
def episode_scope(trajectory: str) -> Iterator[None]:
    """Run one episode (and the tasks it starts) as `trajectory`: its requests say so, its errors are stamped."""
    token = _EPISODE.set(trajectory)
    try:
        with trajectory_scope(trajectory):
            yield
    finally:
        _EPISODE.reset(token)
