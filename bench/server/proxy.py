"""`rollout-bench proxy`: the fault engine in front of a live engine, and the context `run --upstream` serves from.

`load_upstream_context` asks the upstream what it serves (`bench.capture.upstream.probe`, as the recorder does),
picks the tokenizer (`--tokenizer DIR`, else the bench's own when the upstream is the bench's mock, else a clear
refusal), refuses by name a plan fault that cannot act on live replies (`faults.live`), and builds a server
context in upstream mode: the same app, fault engine and logs as `serve`, with answers from the engine instead of
a trace's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any, Collection

from bench.capture.tracker import KnownGroup, TrafficTracker, ids_key
from bench.capture.upstream import UpstreamError, UpstreamInfo, probe, split_credentials, tokenizer_for
from bench.replay import TraceStore
from bench.replay.store import RecordedTrajectory
from bench.trace.shipped import resolve_trace
from faults import Plan, resolve_plan
from faults.live import check_live_plan

from .context import ServerConfig, ServerContext
from .profiles import DEFAULT_PROFILE, get_profile
from .upstream import Upstream


def known_groups(store: TraceStore) -> dict[bytes, KnownGroup]:
    """A trace's groups for the tracker, by prompt: the live traffic's identities are then the trace's ids."""
    members: dict[str, list[RecordedTrajectory]] = defaultdict(list)
    for trajectory in store.trajectories:
        members[trajectory.group_id].append(trajectory)
    known = {}
    for group, trajectories in members.items():
        first = trajectories[0]
        prompt = ids_key(array("i", first.sequences[0][: first.prompt_len * 4]))
        known[prompt] = KnownGroup(group, tuple(t.id for t in trajectories), tuple(t.index for t in trajectories))
    return known


class ProxyError(ValueError):
    """The proxy cannot serve in front of this upstream (unreachable, no tokenizer, no context length): a bad
    command line, which the command line reports as such."""


def _ask(upstream: str) -> UpstreamInfo:
    """The upstream's own account (`bench.capture.upstream.probe`), from sync code inside or outside a loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(asyncio.run, probe(upstream)).result()
        except UpstreamError as error:
            raise ProxyError(str(error)) from None


def load_upstream_context(upstream: str, *, trace: str | Path | None = None, plan: Plan | str | None = None,
                          tokenizer_dir: str | None = None, sglang_version: str = DEFAULT_PROFILE,
                          context_length: int | None = None, adapter: bool = False,
                          groups_of: Collection[str] | None = None, time_scale: float = 0.0,
                          **options: Any) -> ServerContext:
    """A server context whose answers come from the engine at `upstream`. `trace`: the dataset whose prompts
    the client sends (its trajectory and group ids name the traffic); `adapter`: a bench target adapter is the
    client (`run --upstream`: client-side faults are then allowed). `time_scale` is ignored: the engine paces
    its own answers. Raises `ProxyError` (unreachable, no tokenizer, no context length) and `PlanError`."""
    del time_scale
    info = _ask(upstream)
    try:
        tokenizer, _, _ = tokenizer_for(info, tokenizer_dir)
    except UpstreamError as error:
        raise ProxyError(str(error)) from None
    if tokenizer is None:
        raise ProxyError(f"upstream {upstream} is not the bench's mock, and the proxy rewrites answers in the "
                            "model's vocabulary: give --tokenizer DIR (the model's local tokenizer folder)")
    context = context_length or info.context_length
    if not context or context <= 0:
        raise ProxyError(f"upstream {upstream} names no context length (neither /get_server_info's "
                            "context_length nor /v1/models' max_model_len): give --context-length")
    if isinstance(plan, str):
        plan = resolve_plan(plan)
    if plan is not None:
        check_live_plan(plan, tokenizer=True, adapter=adapter)
    store = TraceStore.load(resolve_trace(str(trace)), groups_of=groups_of) if trace is not None else None
    tracker = TrafficTracker(known_groups=known_groups(store) if store is not None else None)
    options.setdefault("openai_flavor", "sglang" if info.server == "sglang" else "vllm")
    config = ServerConfig(profile=get_profile(sglang_version), model=info.model, context_length=context,
                          time_scale=0.0, **options)
    return ServerContext(config, store, tokenizer, plan, tokenizer_folder=Path(tokenizer_dir) if tokenizer_dir else None,
                         upstream=Upstream(upstream.rstrip("/"), tracker,
                                                                           named=store is not None))


async def proxy(upstream: str, *, host: str, port: int, log_dir: str | None = None, **options: Any) -> int:
    """Serve the proxy on host:port until SIGINT or SIGTERM; print what it did."""
    from .app import BenchServer
    from .serve import serve_until_signalled, spill_folder

    control_token, limits = options.pop("control_token", None), options.pop("limits", None)
    server = BenchServer(context=load_upstream_context(upstream, **options), host=host, port=port,
                         control_token=control_token, limits=limits, spill_dir=spill_folder(log_dir))

    def banner(url: str) -> str:
        ctx = server.context
        return (f"rollout-bench proxy at {url} in front of {split_credentials(upstream)[0]} (model {ctx.config.model}, context "
                f"{ctx.config.context_length}, answers written as SGLang {ctx.config.profile.version}, tokenizer "
                f"{getattr(ctx.tokenizer, 'name', '?')})")

    return await serve_until_signalled(server, host, banner, log_dir)
