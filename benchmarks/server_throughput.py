"""`python -m benchmarks.server_throughput`: the bench server's requests/s beside bare aiohttp, in one run.

The design's performance budget (README, Benchmarks): the bench aims at 0.8 of a bare aiohttp handler returning a
precomputed SGLang body, with replay and the fault engine on. Four servers answer the same `/generate` requests (the
trace's turn-0 prompts with their recorded sampling parameters, named in `X-Bench-Trajectory` as the
reference targets do, so each is identified, never drifted) with the same reply bytes:

  bare-bytes  bare aiohttp, precomputed body bytes: the ceiling
  bare-json   bare aiohttp building the body per request with json.dumps
  bench       the bench server replaying the trace, no fault plan
  bench-plan  the same with a fault plan: the engine decides on every request

Each server runs in its own process pinned to one core; the load generator (`http_load`, C keep-alive
connections) runs here, pinned to another. Rounds are interleaved (the order rotates each round) and the
median is reported, as requests/s and as the server's CPU time per answer (which does not depend on the
load generator keeping up). The plan leaves out the fault types that only wait (latency, slow first
token, stall): with a closed-loop client their sleeps, not the server's work, would set the rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

from .common import (
    add_pinning_arguments,
    add_window_arguments,
    check_window_arguments,
    interleaved,
    median,
    print_table,
    start_pinned,
    process_cpu_s,
    write_results,
)
from .http_load import measure_rounds, raw_request
from .throughput_servers import KINDS, TRAJECTORY_HEADER

HOST = "127.0.0.1"
WAITING_FAULTS = "latency,slow_first_token,stall"
WHAT = {
    "bare-bytes": "bare aiohttp, precomputed body bytes (ceiling)",
    "bare-json": "bare aiohttp, body built per request (json.dumps)",
    "bench": "bench server, replay, no plan",
    "bench-plan": "bench server, replay + fault plan",
}
AIM = 0.8  # the design's performance budget (README, Benchmarks: the performance aims)


def trace_requests(trace: str, limit: int | None) -> list[tuple[str, bytes]]:
    """(trajectory id, JSON body) of each trajectory's first request, as a rollout sends it."""
    from bench.replay import TraceStore
    from bench.trace.shipped import resolve_trace

    store = TraceStore.load(resolve_trace(trace))
    requests = []
    for trajectory in store.trajectories[:limit]:
        prompt = list(array("i", trajectory.sequences[0][: trajectory.prompt_len * 4]))
        body = {"input_ids": prompt, "sampling_params": dict(trajectory.first_sampling_params), "return_logprob": True}
        requests.append((trajectory.id, json.dumps(body, separators=(",", ":")).encode()))
    return requests


class ServerProcess:
    """One `benchmarks.throughput_servers` process; stopped with SIGTERM (its pid only)."""

    def __init__(self, kind: str, core: int | None, extra: list[str]) -> None:
        self.kind = kind
        command = [sys.executable, "-m", "benchmarks.throughput_servers", kind, *extra]
        if core is not None:
            command += ["--core", str(core)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self.pid = self.process.pid
        self.port = 0
        self.core: int | None = None

    def wait_ready(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} server exited with status {self.process.wait()} before listening")
        ready = json.loads(line)
        self.port, self.core = int(ready["port"]), ready["core"]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=120) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def fetch_replies(server: ServerProcess, requests: list[tuple[str, bytes]]) -> dict[str, list[Any]]:
    """The bench server's reply to each request: what the bare servers will send back."""
    replies: dict[str, list[Any]] = {}
    for trajectory, body in requests:
        request = urllib.request.Request(f"http://{HOST}:{server.port}/generate", data=body, method="POST",
                                         headers={"Content-Type": "application/json", TRAJECTORY_HEADER: trajectory})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                replies[trajectory] = [reply.status, json.loads(reply.read())]
        except urllib.error.HTTPError as error:
            replies[trajectory] = [error.code, json.loads(error.read())]
    return replies


def check_identified(server: ServerProcess, endpoint: str = "/generate") -> dict[str, int]:
    """How the bench server took the requests: every one identified as its trajectory's turn 0, none drifted."""
    records = [r for r in server.get("/bench/requests") if r["endpoint"] == endpoint]
    return {"requests": len(records),
            "identified": sum(1 for r in records if r["trajectory"] and r["turn"] == 0 and r["drift"] is None),
            "drifted": sum(1 for r in records if r["drift"] is not None)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_window_arguments(parser, "the four servers")
    parser.add_argument("--trace", default="rlvr-500", help="trace whose prompts are sent (rlvr-500)")
    parser.add_argument("--requests", type=int, help="use only the first N trajectories (default all)")
    parser.add_argument("--plan", default="chaos", help="fault plan of bench-plan (chaos)")
    parser.add_argument("--without", default=WAITING_FAULTS,
                        help=f"fault types left out of the plan (default {WAITING_FAULTS}; '' keeps all)")
    add_pinning_arguments(parser)
    args = parser.parse_args(argv)
    check_window_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info, server_core, client_core, parameters = start_pinned(args)
    requests = trace_requests(args.trace, args.requests)
    raw = [raw_request(HOST, 0, "/generate", body, {TRAJECTORY_HEADER: trajectory}) for trajectory, body in requests]
    without = ["--without", args.without]
    servers: dict[str, ServerProcess] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rb-throughput-"))
    try:
        for kind in ("bench", "bench-plan"):
            servers[kind] = ServerProcess(kind, server_core,
                                          ["--trace", args.trace, "--plan", args.plan, *without])
        for kind in ("bench", "bench-plan"):
            servers[kind].wait_ready()
        replies = fetch_replies(servers["bench"], requests)
        reply_bytes = median([len(json.dumps(reply, separators=(",", ":"))) for _, reply in replies.values()])
        bodies = scratch / "bodies.json"
        bodies.write_text(json.dumps(replies))
        for kind in ("bare-bytes", "bare-json"):
            servers[kind] = ServerProcess(kind, server_core, ["--bodies", str(bodies)])
        for kind in ("bare-bytes", "bare-json"):
            servers[kind].wait_ready()
        print(f"servers on core {servers['bench'].core}, load generator on core {client_core}; "
              f"{len(requests)} distinct requests from {args.trace}, replies of {reply_bytes:.0f} bytes (median)")
        windows = measure_rounds(HOST, {kind: (s.port, _cpu_of(s.pid)) for kind, s in servers.items()}, KINDS, raw,
                                 args, interleaved)
        identified = {kind: check_identified(servers[kind]) for kind in ("bench", "bench-plan")}
        faults = servers["bench-plan"].get("/bench/faults")["events"]
        plan_text = servers["bench-plan"].get("/bench/plan")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    rows = _rows(windows)
    print()
    print_table(["server", "what", "req/s", "ratio", "server CPU", "CPU us/answer", "cost ratio", "not 200"],
                [[r["server"], r["what"], r["requests_per_s"], r["ratio_to_bare_bytes"], r["server_cpu_share"],
                  r["server_cpu_us_per_answer"], r["cost_ratio_to_bare_bytes"], r["not_200"]] for r in rows])
    fired = Counter(e["fault"] for e in faults)
    print(f"\nratio: req/s over bare-bytes' (median of {args.rounds} round(s) of {args.seconds:g} s); cost ratio: "
          "bare-bytes' server CPU per answer over this server's (1.0 = as cheap as the ceiling)")
    for kind, seen in identified.items():
        print(f"{kind}: {seen['identified']} of {seen['requests']} requests identified as their trajectory's turn 0, "
              f"{seen['drifted']} drifted")
    print(f"bench-plan: plan {plan_text['name']!r} ({len(plan_text['rules'])} rules), {len(faults)} fault events, "
          f"{len(fired)} fault types fired")
    plan_ratio = next(r["ratio_to_bare_bytes"] for r in rows if r["server"] == "bench-plan")
    verdict = "meets" if plan_ratio >= AIM else "is below"
    print(f"bench-plan at {plan_ratio:.2f} of bare aiohttp {verdict} the design's {AIM} budget "
          "(README, Benchmarks: the performance aims)")
    payload = {"benchmark": "server_throughput", "machine": info, "parameters": parameters,
               "servers": {kind: {"core": s.core} for kind, s in servers.items()}, "rows": rows,
               "reply_bytes_median": reply_bytes, "windows": windows, "identified": identified, "plan": plan_text,
               "fault_events": len(faults), "faults_fired": dict(sorted(fired.items()))}
    json_path, csv_path = write_results(args.out, "server_throughput", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0


def _cpu_of(pid: int) -> Any:
    return lambda: process_cpu_s(pid)


def _rows(windows: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    base_rate = median([w["requests_per_s"] for w in windows["bare-bytes"]])
    base_cost = median([w["server_cpu_us_per_answer"] for w in windows["bare-bytes"]])
    rows = []
    for kind in KINDS:
        rate = median([w["requests_per_s"] for w in windows[kind]])
        cost = median([w["server_cpu_us_per_answer"] for w in windows[kind]])
        statuses: Counter[str] = Counter()
        for window in windows[kind]:
            statuses.update(window["statuses"])
        rows.append({"server": kind, "what": WHAT[kind], "requests_per_s": round(rate, 1),
                     "ratio_to_bare_bytes": round(rate / base_rate, 3) if base_rate else float("nan"),
                     "server_cpu_share": round(median([w["server_cpu_share"] for w in windows[kind]]), 3),
                     "server_cpu_us_per_answer": round(cost, 1),
                     "cost_ratio_to_bare_bytes": round(base_cost / cost, 3) if cost else float("nan"),
                     "not_200": sum(n for status, n in statuses.items() if status != "200"),
                     "rounds_requests_per_s": [round(w["requests_per_s"], 1) for w in windows[kind]]})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
