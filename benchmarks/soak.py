"""`python -m benchmarks.soak` (`make soak`): the mock server under mixed traffic for a long time, watched.

A `rollout-bench serve` process (the trace, the chaos plan, its seed) takes rollout-shaped traffic: each trajectory's
turns in order, on the native route (streamed or not) and the OpenAI completions route, named by
`X-Bench-Trajectory`, with admin calls mixed in; cycle after cycle over the trace until the time is up. Every few
seconds the server's resident memory and open file descriptors are sampled. It passes when:

- memory after warm-up (the first full cycle, the first tenth of the time, and the server's bounded logs filled:
  1.25 x its --keep-requests requests, whichever ends last) grows by at most 10% to the end, and file descriptors do
  not grow (a little slack for connections being replaced);
- determinism is intact: the fault events of the first cycle, sent at the soak's concurrency, are the very events a
  fresh server gives the same cycle sent at concurrency 2 (the same seed decides the same faults, whatever the
  interleaving);
- nothing answered 5xx except what a fault injected (or the SGLang-faithful 500s the log names), and the server
  answers /health at the end.

The figures (a table, a JSON file, a CSV of the samples and a plot of memory and descriptors over time) go to
`reports/bench/soak/`; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp

from bench.server.limits import SERVE_KEEP_REQUESTS

from .common import DEFAULT_OUT, machine, print_table, write_results

TRAJECTORY_HEADER = "X-Bench-Trajectory"
RSS_GROWTH_BOUND = 0.10
FD_SLACK = 8
SAMPLE_EVERY_S = 5.0
ADMIN_EVERY = 25  # one admin call per this many generation requests
ADMIN_CALLS = [("GET", "/health", None), ("GET", "/get_model_info", None), ("GET", "/v1/loads", None),
               ("POST", "/tokenize", {"prompt": "soak"}), ("POST", "/abort_request", {"rid": "no-such-request"}),
               ("GET", "/get_server_info", None), ("GET", "/v1/models", None)]


@dataclass(frozen=True)
class Turn:
    trajectory: str
    turn: int
    route: str  # "generate", "generate-stream", "completions"
    body: bytes


@dataclass
class Tally:
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    client_errors: dict[str, int] = field(default_factory=dict)

    def count(self, status: int | None, error: str | None = None) -> None:
        self.requests += 1
        key = str(status) if status is not None else "none"
        self.statuses[key] = self.statuses.get(key, 0) + 1
        if error:
            self.client_errors[error] = self.client_errors.get(error, 0) + 1


def cycle_of(trace: str, limit: int | None) -> list[list[Turn]]:
    """Each trajectory's turns as the rollout sends them; the route is a fixed function of (trajectory, turn), so
    every cycle and every concurrency sends the same requests."""
    from bench.replay import TraceStore
    from bench.trace.shipped import resolve_trace

    store = TraceStore.load(resolve_trace(trace))
    cycle = []
    for trajectory in store.trajectories[:limit]:
        turns = []
        for index, recorded in enumerate(trajectory.turns):
            ids = list(array("i", trajectory.sequences[recorded.sequence][: recorded.input_len * 4]))
            params = dict(trajectory.first_sampling_params)
            route = ("generate", "generate-stream", "completions")[zlib.crc32(f"{trajectory.id}/{index}".encode()) % 3]
            if route == "completions":
                body = {"model": "soak", "prompt": ids, "max_tokens": int(params.get("max_new_tokens") or 256),
                        "temperature": params.get("temperature", 1.0), "logprobs": 1}
            else:
                body = {"input_ids": ids, "sampling_params": params, "return_logprob": True,
                        "stream": route == "generate-stream"}
            turns.append(Turn(trajectory.id, index, route, json.dumps(body, separators=(",", ":")).encode()))
        cycle.append(turns)
    return cycle


class Server:
    """A `rollout-bench serve` process on an ephemeral port; stopped by its pid only."""

    def __init__(self, trace: str, plan: str, seed: int, log_dir: Path | None = None,
                 keep_requests: int | None = None) -> None:
        command = [sys.executable, "-m", "bench", "serve", "--trace", trace, "--plan", plan, "--seed", str(seed),
                   "--port", "0", "--time-scale", "0"]
        if log_dir is not None:  # the server's older log rows spill there while it runs (bounded memory)
            command += ["--log-dir", str(log_dir)]
        if keep_requests is not None:
            command += ["--keep-requests", str(keep_requests)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r"at (http://[\d.]+:\d+) ", line)
        if not found:
            self.stop()
            raise RuntimeError(f"the server did not start: {line!r}")
        self.url = found.group(1)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def _send(http: aiohttp.ClientSession, url: str, turn: Turn, tally: Tally) -> None:
    path = "/v1/completions" if turn.route == "completions" else "/generate"
    try:
        async with http.post(url + path, data=turn.body, headers={"Content-Type": "application/json",
                                                                   TRAJECTORY_HEADER: turn.trajectory}) as reply:
            await reply.read()
            tally.count(reply.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:  # an injected reset, cut or stall: counted, not fatal
        tally.count(None, type(error).__name__)


async def _admin(http: aiohttp.ClientSession, url: str, index: int, tally: Tally) -> None:
    method, path, body = ADMIN_CALLS[index % len(ADMIN_CALLS)]
    try:
        async with http.request(method, url + path, json=body) as reply:
            await reply.read()
            tally.count(reply.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        tally.count(None, type(error).__name__)


async def drive(url: str, cycle: list[list[Turn]], concurrency: int, until: float | None, tally: Tally,
                after_first_cycle: Callable[[], Awaitable[None]] | None = None) -> int:
    """Send cycles of the trace with `concurrency` trajectories in flight (each one's turns in order) until the
    monotonic time `until` (None: one cycle). Each cycle completes before the next begins, and `after_first_cycle`
    runs in between the first and the second. Cycles sent."""
    timeout = aiohttp.ClientTimeout(total=120)
    cycles = 0
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency + 2)) as http:
        sent = 0

        async def worker(queue: asyncio.Queue[list[Turn]]) -> None:
            nonlocal sent
            while True:
                turns = await queue.get()
                try:
                    for turn in turns:
                        await _send(http, url, turn, tally)
                        sent += 1
                        if sent % ADMIN_EVERY == 0:
                            await _admin(http, url, sent // ADMIN_EVERY, tally)
                finally:
                    queue.task_done()

        queue: asyncio.Queue[list[Turn]] = asyncio.Queue(maxsize=concurrency * 2)
        workers = [asyncio.create_task(worker(queue)) for _ in range(concurrency)]
        try:
            while True:
                for turns in cycle:
                    await queue.put(turns)
                await queue.join()  # a barrier per cycle: the first cycle's fault events are its own
                cycles += 1
                if after_first_cycle is not None and cycles == 1:
                    await after_first_cycle()
                if until is None or time.monotonic() >= until:
                    break
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    return cycles


def _json(url: str, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url + path, timeout=120) as reply:
        return json.loads(reply.read())


def _events(url: str) -> list[tuple[Any, ...]]:
    return sorted((e["rule"], e["fault"], e["trajectory"], e["turn"], e["attempt"])
                  for e in _json(url, "/bench/faults")["events"])


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    cycle = cycle_of(args.trace, args.trajectories)
    requests_per_cycle = sum(len(turns) for turns in cycle)
    print(f"soak: {args.minutes} min, trace {args.trace} ({len(cycle)} trajectories, {requests_per_cycle} requests "
          f"a cycle), plan {args.plan}, seed {args.seed}, concurrency {args.concurrency}", flush=True)
    keep = args.keep_requests or SERVE_KEEP_REQUESTS
    server = Server(args.trace, args.plan, args.seed, args.out / "server-logs", keep)
    samples: list[dict[str, Any]] = []
    tally = Tally()
    started = time.monotonic()
    first_events: list[tuple[Any, ...]] = []
    warm_at: float | None = None

    async def snapshot() -> None:  # between the first cycle and the second: that cycle's events alone
        nonlocal first_events, warm_at
        first_events = await asyncio.to_thread(_events, server.url)
        warm_at = max(time.monotonic() - started, args.minutes * 6)  # a tenth of the time, in seconds

    try:
        until = started + args.minutes * 60
        driving = asyncio.create_task(drive(server.url, cycle, args.concurrency, until, tally, snapshot))
        while not driving.done():
            samples.append({"t_s": round(time.monotonic() - started, 1), "requests": tally.requests,
                            "rss_mb": round(server.rss_mb(), 1), "fds": server.fds()})
            print(f"  {samples[-1]['t_s']:7.1f} s  {tally.requests:8d} requests  rss {samples[-1]['rss_mb']:7.1f} MB"
                  f"  fds {samples[-1]['fds']}", flush=True)
            await asyncio.wait([driving], timeout=SAMPLE_EVERY_S)
        cycles = driving.result()
        samples.append({"t_s": round(time.monotonic() - started, 1), "requests": tally.requests,
                        "rss_mb": round(server.rss_mb(), 1), "fds": server.fds()})
        healthy = await asyncio.to_thread(lambda: _status(server.url + "/health") == 200)
        log = await asyncio.to_thread(_json, server.url, "/bench/requests")
    finally:
        server.stop()
    on_disk = _logs_on_disk(args.out / "server-logs")
    if not first_events:
        raise RuntimeError("the soak ended before its first cycle did: give it more minutes or fewer trajectories")
    fresh = Server(args.trace, args.plan, args.seed)
    try:
        await drive(fresh.url, cycle, 2, None, Tally())
        fresh_events = await asyncio.to_thread(_events, fresh.url)
    finally:
        fresh.stop()
    return _verdict(args, samples, tally, cycles, requests_per_cycle, warm_at or 0.0, healthy, log, first_events,
                    fresh_events, on_disk)


def _logs_on_disk(folder: Path) -> dict[str, Any]:
    """What the server left in its --log-dir at shutdown: requests.csv's rows, and whether its spill folder is gone
    (every chunk written into the CSV)."""
    import csv

    path = folder / "requests.csv"
    rows = sum(1 for _ in csv.reader(path.open(newline=""))) - 1 if path.exists() else 0
    return {"requests_csv_rows": rows, "spill_left": (folder / "spill").exists()}


def _status(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as reply:
        return int(reply.status)


def _verdict(args: argparse.Namespace, samples: list[dict[str, Any]], tally: Tally, cycles: int,
             requests_per_cycle: int, warm_at: float, healthy: bool, log: list[dict[str, Any]],
             first_events: list[tuple[Any, ...]], fresh_events: list[tuple[Any, ...]],
             on_disk: dict[str, Any]) -> dict[str, Any]:
    # warm-up also lasts until the server's bounded logs are full: it keeps `keep_requests` requests in memory and
    # trims back to that many each time a quarter more came in, so its memory grows by design until then
    fill = int(1.25 * (getattr(args, "keep_requests", None) or SERVE_KEEP_REQUESTS)) + 1
    warm = next((s for s in samples if s["t_s"] >= warm_at and s["requests"] >= fill), samples[-1])
    last = samples[-1]
    growth = (last["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"]
    unexplained = [row for row in log if (row.get("status") or 0) >= 500 and not _explained(row)]
    checks = {
        "rss_growth_after_warmup": {"value": round(growth, 4), "bound": RSS_GROWTH_BOUND,
                                    "ok": growth <= RSS_GROWTH_BOUND},
        "fd_growth_after_warmup": {"value": last["fds"] - warm["fds"], "bound": FD_SLACK,
                                   "ok": last["fds"] - warm["fds"] <= FD_SLACK},
        "determinism_first_cycle": {"value": f"{len(first_events)} events at concurrency {args.concurrency}, "
                                             f"{len(fresh_events)} at 2",
                                    "ok": first_events == fresh_events and len(first_events) > 0},
        "no_unexplained_5xx": {"value": len(unexplained), "ok": not unexplained},
        "healthy_at_end": {"value": healthy, "ok": healthy},
        "log_row_per_request": {"value": f"{len(log)} rows, {tally.requests} requests sent",
                                "ok": len(log) >= tally.requests and [r["seq"] for r in log] == list(range(len(log)))},
        "whole_log_on_disk": {"value": f"{on_disk['requests_csv_rows']} rows in requests.csv",
                              "ok": on_disk["requests_csv_rows"] >= len(log) and not on_disk["spill_left"]},
    }
    return {"machine": machine(), "minutes": args.minutes, "trace": args.trace, "plan": args.plan, "seed": args.seed,
            "concurrency": args.concurrency, "cycles": cycles, "requests_per_cycle": requests_per_cycle,
            "requests": tally.requests, "statuses": tally.statuses, "client_errors": tally.client_errors,
            "warm_at_s": warm["t_s"], "rss_mb": {"warm": warm["rss_mb"], "end": last["rss_mb"]},
            "fds": {"warm": warm["fds"], "end": last["fds"]}, "rss_mb_start": samples[0]["rss_mb"],
            "load_average": os.getloadavg(), "checks": checks, "samples": samples,
            "unexplained_5xx": unexplained[:20]}


def _explained(row: dict[str, Any]) -> bool:
    """A 5xx the plan injected (the row names its fault) or one SGLang itself answers (the row says so)."""
    error = str(row.get("error") or "")
    return bool(row.get("faults")) or error.startswith("as SGLang ") or error == "fault replacement"


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    top.plot([s["t_s"] for s in samples], [s["rss_mb"] for s in samples])
    top.axvline(result["warm_at_s"], color="grey", linestyle="--", label="end of warm-up")
    top.set_ylabel("resident memory (MB)")
    top.set_ylim(bottom=0)
    top.set_title(f"Soak: {result['minutes']} min of {result['trace']} under plan {result['plan']}")
    top.legend(loc="lower right")
    bottom.plot([s["t_s"] for s in samples], [s["fds"] for s in samples], color="tab:green")
    bottom.set_ylabel("open file descriptors")
    bottom.set_xlabel("time since the start (s)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlim(left=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to drive traffic (default 30)")
    parser.add_argument("--trace", default="agentic-500")
    parser.add_argument("--trajectories", type=int, help="use only the first N trajectories of the trace")
    parser.add_argument("--plan", default="chaos")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "soak")
    parser.add_argument("--keep-requests", type=int, help="the server's --keep-requests (default: serve's own; the "
                        "quick mode keeps 1,000 so that its log spills to disk within the 20 s)")
    parser.add_argument("--quick", action="store_true", help="20 seconds over 40 trajectories (the test's mode)")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.trajectories = 1 / 3, args.trajectories or 40
        args.keep_requests = args.keep_requests or 1_000
    if args.minutes <= 0 or args.concurrency < 1 or (args.trajectories is not None and args.trajectories < 1):
        parser.error("--minutes, --concurrency and --trajectories must be positive")
    result = asyncio.run(soak(args))
    rows = [{"check": name, "value": check["value"], "bound": check.get("bound", ""), "ok": check["ok"]}
            for name, check in result["checks"].items()]
    print_table(["check", "value", "bound", "ok"], [[r["check"], r["value"], r["bound"], r["ok"]] for r in rows])
    print(f"{result['requests']} requests in {result['cycles']} cycles; statuses {result['statuses']}; "
          f"client-side errors {result['client_errors']}")
    json_path, _ = write_results(args.out, "soak", result, result["samples"])
    print(f"results: {json_path}  plot: {plot(result, args.out / 'soak.png')}")
    return 0 if all(check["ok"] for check in result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
