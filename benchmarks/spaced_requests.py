"""`python -m benchmarks.spaced_requests`: what one request costs a server when requests come spaced out, as in a run.

`server_throughput` loads the servers back to back (closed loop): every event-loop wake-up serves many requests,
and the caches stay warm. A rollout run does not: the target under test sends a few hundred requests a second
(`run --target ref-tool-loop:fixed` on agentic-500: about 400 at `--time-scale 0`), so the server sleeps between
them and each request wakes it alone. This benchmark measures the server's CPU per answer both ways, on the same
requests, for three servers pinned to one core:

  bare-protocol  an asyncio protocol writing precomputed answer bytes: no HTTP framework (the machine's floor)
  bare-bytes     bare aiohttp answering precomputed body bytes (server_throughput's ceiling)
  bench          the bench server replaying the trace, no fault plan, answering at once (time scale 0)

Spaced load: `--concurrency` keep-alive connections, each waiting a random (exponential) think time after an
answer before its next request, so that together they ask `--rates` requests a second; the think times come
from `--seed` (printed). Rate 0 is back to back. The difference between a server's spaced and back-to-back cost
is what waking up for a request costs it; the bare servers' spaced cost is a floor that no aiohttp server can
go under at that rate on this machine, whatever it does per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from .common import (
    add_pinning_arguments,
    add_window_arguments,
    check_window_arguments,
    interleaved,
    median,
    print_table,
    start_pinned,
    threads_cpu_s,
    write_results,
)
from .http_load import measure, raw_request
from .server_throughput import HOST, ServerProcess, check_identified, fetch_replies, trace_requests
from .throughput_servers import TRAJECTORY_HEADER

KINDS = ("bare-protocol", "bare-bytes", "bench")
RUN_AIM_US = 250  # issue 18: bench CPU per served request in `run --target ref-tool-loop:fixed --plan seed-004`


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spaced_requests", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_window_arguments(parser, "the three servers at every rate", connections=8)
    parser.add_argument("--rates", help="requests a second asked of each server, comma-separated; 0: back to back "
                                         "(0,100,400,1600; with --quick 0,400)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the think times (0)")
    parser.add_argument("--trace", default="rlvr-500", help="trace whose turn-0 prompts are sent (rlvr-500)")
    parser.add_argument("--requests", type=int, help="use only the first N trajectories (default all)")
    add_pinning_arguments(parser)
    args = parser.parse_args(argv)
    check_window_arguments(parser, args)
    given = args.rates if args.rates is not None else "0,400" if args.quick else "0,100,400,1600"
    try:
        args.rates = [float(rate) for rate in given.split(",") if rate.strip()]
    except ValueError:
        parser.error(f"--rates: {given!r} is not a comma-separated list of numbers")
    if not args.rates or any(rate < 0 for rate in args.rates):
        parser.error(f"--rates: {given!r}: give at least one rate, none negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info, server_core, client_core, parameters = start_pinned(args)
    print(f"think times from seed {args.seed}")
    requests = trace_requests(args.trace, args.requests)
    raw = [raw_request(HOST, 0, "/generate", body, {TRAJECTORY_HEADER: trajectory}) for trajectory, body in requests]
    servers: dict[str, ServerProcess] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rb-spaced-"))
    try:
        servers["bench"] = ServerProcess("bench", server_core, ["--trace", args.trace])
        servers["bench"].wait_ready()
        bodies = scratch / "bodies.json"
        bodies.write_text(json.dumps(fetch_replies(servers["bench"], requests)))
        for kind in ("bare-protocol", "bare-bytes"):
            servers[kind] = ServerProcess(kind, server_core, ["--bodies", str(bodies)])
            servers[kind].wait_ready()
        print(f"servers on core {servers['bench'].core}, load generator on core {client_core}; "
              f"{len(requests)} distinct requests from {args.trace}, {args.concurrency} connections")
        rng = random.Random(args.seed)
        windows: dict[tuple[float, str], list[dict[str, Any]]] = {}
        cells = [(rate, kind) for rate in args.rates for kind in KINDS]
        for _, (rate, kind) in interleaved(cells, args.rounds):
            think = _think_times(rng, rate, args.concurrency)
            window = asyncio.run(measure(HOST, servers[kind].port, raw, args.concurrency, args.warmup,
                                         args.seconds, _cpu_of(servers[kind].pid), think))
            windows.setdefault((rate, kind), []).append(window)
            print(f"  {_mode(rate):<14} {kind:<13} {window['requests_per_s']:8.0f} req/s, "
                  f"{window['server_cpu_us_per_answer']:7.1f} us of server CPU an answer", flush=True)
        identified = check_identified(servers["bench"])
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    rows = _rows(windows, args.rates)
    print()
    print_table(["mode", "server", "req/s", "CPU us/answer", "x back to back", "x bare-bytes", "not 200"],
                [[r["mode"], r["server"], r["requests_per_s"], r["server_cpu_us_per_answer"],
                  r["cost_over_back_to_back"], r["cost_over_bare_bytes"], r["not_200"]] for r in rows])
    print(f"\nCPU us/answer: the server's CPU per answer, median of {args.rounds} round(s) of {args.seconds:g} s; "
          "x back to back: over the same server's back-to-back cost; x bare-bytes: over bare aiohttp's at that rate")
    print(f"bench: {identified['identified']} of {identified['requests']} requests identified as their trajectory's "
          f"turn 0, {identified['drifted']} drifted")
    for rate in args.rates:
        if rate:
            cost = {r["server"]: r["server_cpu_us_per_answer"] for r in rows if r["rate"] == rate}
            print(f"at {rate:g} requests/s: bare aiohttp {cost['bare-bytes']:.0f} us an answer, the bench server "
                  f"{cost['bench']:.0f}; the run aim (README, Benchmarks) is {RUN_AIM_US} us a request for a whole "
                  "run, its checks, trace load and pacing included")
    payload = {"benchmark": "spaced_requests", "machine": info, "parameters": parameters, "seed": args.seed,
               "rows": rows, "identified": identified,
               "windows": {f"{_mode(rate)} {kind}": found for (rate, kind), found in windows.items()}}
    json_path, csv_path = write_results(args.out, "spaced_requests", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0


def _think_times(rng: random.Random, rate: float, connections: int) -> Callable[[], float] | None:
    """Each connection's wait after an answer: exponential, so that `connections` of them ask `rate` a second."""
    if not rate:
        return None
    mean = connections / rate
    return lambda: rng.expovariate(1 / mean)


def _mode(rate: float) -> str:
    return f"{rate:g} req/s" if rate else "back to back"


def _cpu_of(pid: int) -> Callable[[], float]:
    return lambda: threads_cpu_s(pid)


def _rows(windows: dict[tuple[float, str], list[dict[str, Any]]], rates: list[float]) -> list[dict[str, Any]]:
    cost = {key: median([w["server_cpu_us_per_answer"] for w in found]) for key, found in windows.items()}
    rows = []
    for rate in rates:
        for kind in KINDS:
            found = windows[(rate, kind)]
            own = cost[(rate, kind)]
            closed = cost.get((0.0, kind))
            rows.append({"mode": _mode(rate), "rate": rate, "server": kind,
                         "requests_per_s": round(median([w["requests_per_s"] for w in found]), 1),
                         "server_cpu_us_per_answer": round(own, 1),
                         "cost_over_back_to_back": round(own / closed, 2) if closed else None,
                         "cost_over_bare_bytes": round(own / cost[(rate, "bare-bytes")], 2),
                         "not_200": sum(n for w in found for status, n in w["statuses"].items() if status != "200"),
                         "rounds_cpu_us_per_answer": [round(w["server_cpu_us_per_answer"], 1) for w in found]})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
