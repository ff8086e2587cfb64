"""`rollout-bench proxy`: the fault engine in front of a live engine, and the context `run --upstream` serves from.

`load_upstream_context` asks the upstream what it serves (`upstream.probe`), picks the tokenizer (`--tokenizer
DIR`, else the bench's own when the upstream tokenizes as it does, else a clear refusal), refuses by name a plan
fault that cannot act on live replies (`faults.live`), and builds a server context in upstream mode: the same
app, fault engine and logs as `serve`, with answers from the engine instead of a trace.
"""

from __future__ import annotations

import asyncio
import signal
from array import array
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Collection

from bench.capture.tracker import KnownGroup, TrafficTracker, ids_key
from bench.replay import TraceStore
from bench.replay.store import RecordedTrajectory
from bench.tokenizer import load_tokenizer
from bench.trace.shipped import resolve_trace
from faults import Plan, resolve_plan
from faults.live import check_live_plan

from .context import ServerConfig, ServerContext
from .profiles import DEFAULT_PROFILE, PROFILES, get_profile
from .upstream import Upstream, UpstreamError, probe


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


def _profile(sglang_version: str | None, reported: str | None) -> str:
    """The version profile the proxy writes answers in: the one asked for, else the upstream's, else the default."""
    if sglang_version:
        return sglang_version
    if reported:
        key = reported.split(".post")[0]
        if key in PROFILES:
            return key
    return DEFAULT_PROFILE


def load_upstream_context(upstream: str, *, trace: str | Path | None = None, plan: Plan | str | None = None,
                          tokenizer_dir: str | None = None, sglang_version: str | None = None,
                          context_length: int | None = None, adapter: bool = False,
                          groups_of: Collection[str] | None = None, time_scale: float = 0.0,
                          **options: Any) -> ServerContext:
    """A server context whose answers come from the engine at `upstream`. `trace`: the dataset whose prompts
    the client sends (its trajectory and group ids name the traffic); `adapter`: a bench target adapter is the
    client (`run --upstream`: client-side faults are then allowed). `time_scale` is ignored: the engine paces
    its own answers."""
    del time_scale
    bench_tokenizer = load_tokenizer()
    info = probe(upstream, bench_tokenizer, context_length)
    if tokenizer_dir:
        from bench.tokenizer.hf import HFTokenizer

        tokenizer: Any = HFTokenizer(tokenizer_dir)
    elif info.speaks_bench_tokenizer:
        tokenizer = bench_tokenizer
    else:
        raise UpstreamError(f"upstream {upstream} does not tokenize as the bench's own tokenizer, and the proxy "
                            "rewrites answers in the model's vocabulary: give --tokenizer DIR (the model's local "
                            "tokenizer folder)")
    if isinstance(plan, str):
        plan = resolve_plan(plan)
    if plan is not None:
        check_live_plan(plan, tokenizer=True, adapter=adapter)
    store = TraceStore.load(resolve_trace(str(trace)), groups_of=groups_of) if trace is not None else None
    tracker = TrafficTracker(known_groups=known_groups(store) if store is not None else None)
    engine = Upstream(upstream.rstrip("/"), tracker)
    options.setdefault("openai_flavor", info.openai_flavor)
    config = ServerConfig(profile=get_profile(_profile(sglang_version, info.version)), model=info.model,
                          context_length=info.context_length, time_scale=0.0, **options)
    return ServerContext(config, store, tokenizer, plan, upstream=engine)


async def proxy(upstream: str, *, host: str, port: int, log_dir: str | None = None, **options: Any) -> int:
    """Serve the proxy on host:port until SIGINT or SIGTERM; print what it did."""
    from .app import BenchServer

    server = BenchServer(context=load_upstream_context(upstream, **options), host=host, port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    url = await server.start()
    ctx = server.context
    print(f"rollout-bench proxy at {url} in front of {upstream} (model {ctx.config.model}, context "
          f"{ctx.config.context_length}, answers written as SGLang {ctx.config.profile.version}, tokenizer "
          f"{getattr(ctx.tokenizer, 'name', '?')})", flush=True)
    plan = ctx.faults.plan
    print(f"fault plan {plan.name!r}: {len(plan.rules)} rules, seed {plan.seed}", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: bound to {host}, reachable beyond this machine", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    print(f"stopped after {len(server.log)} requests, {len(ctx.faults.log)} fault events", flush=True)
    silent = ctx.faults.never_fired()
    if silent:
        print(f"rules that never fired: {', '.join(silent)}", flush=True)
    if log_dir:
        folder = Path(log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"request log: {server.log.write_csv(folder / 'requests.csv')}", flush=True)
        print(f"fault log: {ctx.faults.log.write_csv(folder / 'faults.csv')}", flush=True)
    return 0
