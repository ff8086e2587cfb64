"""What `rollout-bench record` adds to each request's latency at 64 concurrent connections.

The upstream is the bench's mock replaying rlvr-500 (a process of its own); the recorder is `rollout-bench
record` in front of it (another process). The same requests (each trajectory's first, as a rollout sends it)
go to the upstream directly and through the recorder, in interleaved rounds, from 64 concurrent aiohttp
connections; every answer's latency is kept. The figure is the difference of the medians (and of the 90th
percentiles): what a rollout behind the recorder waits longer per request. The client runs on the same two
cores, so both arms pay it alike.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.trace import open_trace
from benchmarks.common import machine, print_table, write_results
from benchmarks.server_throughput import HOST, ServerProcess, trace_requests

TARGET_ADDED_MEDIAN_MS = 1.0  # issue 17: under 1 ms median at 64 concurrent connections


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _round(url: str, bodies: list[bytes], concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client(offset: int) -> None:
            index = offset
            while time.monotonic() < deadline:
                body = bodies[index % len(bodies)]
                index += concurrency
                started = time.perf_counter()
                async with session.post(url + "/generate", data=body,
                                        headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"{url}: status {reply.status}")
                latencies.append(time.perf_counter() - started)
        await asyncio.gather(*(client(i) for i in range(concurrency)))
    return latencies


def _start_recorder(upstream: str, out: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench", "record", "--upstream", upstream, "--out", str(out),
                                "--port", str(port)], stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    line = process.stderr.readline()
    if "recording" not in line:
        process.kill()
        raise RuntimeError(f"the recorder did not start: {line}{process.stderr.read()}")
    return process, f"http://{HOST}:{port}"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.record_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0, help="per round and arm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.02,
                        help="the upstream answers at the trace's recorded latencies times this: an engine's pace, "
                             "so the arms compare latency, not two saturated throughputs (0: at once)")
    parser.add_argument("--quick", action="store_true", help="one short round (the test suite's smoke run)")
    parser.add_argument("--out", default="reports/bench")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 0.5
    bodies = [body for _, body in trace_requests("rlvr-500", None)]
    upstream = ServerProcess("bench", None, ["--trace", "rlvr-500", "--time-scale", str(args.time_scale)])
    recorder: subprocess.Popen | None = None
    samples: dict[str, list[float]] = {"direct": [], "recorded": []}
    try:
        upstream.wait_ready()
        direct = f"http://{HOST}:{upstream.port}"
        with tempfile.TemporaryDirectory() as folder:
            recorder, proxied = _start_recorder(direct, Path(folder) / "recording.jsonl")
            for _ in range(args.rounds):
                for arm, url in (("direct", direct), ("recorded", proxied)):
                    samples[arm] += asyncio.run(_round(url, bodies, args.concurrency, args.seconds))
            recorder.send_signal(signal.SIGTERM)
            recorder.wait(timeout=120)
            with open_trace(Path(folder) / "recording.jsonl") as reader:  # the recorder did its whole work
                recorded_turns = sum(len(t.turns) for t in reader)
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
        upstream.stop()
    rows = []
    for arm, values in samples.items():
        rows.append({"arm": arm, "requests": len(values), "median_ms": round(1000 * _percentile(values, 0.5), 3),
                     "p90_ms": round(1000 * _percentile(values, 0.9), 3)})
    added_median = rows[1]["median_ms"] - rows[0]["median_ms"]
    added_p90 = rows[1]["p90_ms"] - rows[0]["p90_ms"]
    print_table(["arm", "requests", "median ms", "p90 ms"], [list(r.values()) for r in rows])
    print(f"added by the recorder: {added_median:.3f} ms median, {added_p90:.3f} ms p90 "
          f"(aim: under {TARGET_ADDED_MEDIAN_MS} ms median) at {args.concurrency} concurrent connections")
    payload = {"machine": machine(), "parameters": {"concurrency": args.concurrency, "rounds": args.rounds,
                                                    "seconds": args.seconds, "time_scale": args.time_scale,
                                                    "quick": args.quick},
               "added_median_ms": round(added_median, 3), "added_p90_ms": round(added_p90, 3),
               "recorded_turns": recorded_turns, "rows": rows}
    write_results(Path(args.out), "record_latency", payload, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
