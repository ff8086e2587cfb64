"""What `rollout-bench record` adds to each request's latency at 64 concurrent connections.

The upstream stands in for an engine: a process of its own that answers every `/generate` after a fixed delay
(`--delay`, an engine's time per request) with one SGLang answer taken from rlvr-500 (its ids, logprobs and
meta_info), so each arm's latencies are narrow and the difference of medians is the recorder's. The recorder is
`rollout-bench record` in front of it (another process). The same requests (rlvr-500's first requests, as a
rollout sends them) go to the upstream directly and through the recorder, in interleaved rounds, from 64
concurrent aiohttp connections. The figure is the difference of the medians (and of the 90th percentiles): what
a rollout behind the recorder waits longer per request. The client runs on the same two cores, so both arms pay
it alike; the recorder's own CPU competes with them, as it would on a rollout's node.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.trace import open_trace
from benchmarks.common import machine, pin_to, print_table, usable_cores, write_results
from benchmarks.server_throughput import HOST, trace_requests

TARGET_ADDED_MEDIAN_MS = 1.0  # issue 17: under 1 ms median at 64 concurrent connections


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _round(url: str, bodies: list[bytes], concurrency: int, seconds: float, stagger: float = 0.0
                 ) -> list[float]:
    """Closed loop: each connection sends its next request on an answer. `stagger`: connection i starts i/C of
    it late, so requests arrive spread out (as an engine's varied latencies spread them), not as one burst."""
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client(offset: int) -> None:
            index = offset
            await asyncio.sleep(stagger * offset / concurrency)
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


def _engine_app(reply: bytes, delay: float) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay)
        return web.Response(body=reply, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    return app


async def _serve_engine(delay: float) -> None:
    """The stand-in engine (`--engine`): prints its port, serves until SIGTERM."""
    from bench.server import ServerThread

    with ServerThread("rlvr-500") as mock:  # one real answer of the mock, with logprobs
        body = [body for _, body in trace_requests("rlvr-500", 1)][0]
        reply = urllib.request.urlopen(urllib.request.Request(mock.url + "/generate", data=body, headers={
            "Content-Type": "application/json"}), timeout=30).read()
    runner = web.AppRunner(_engine_app(reply, delay), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, 0).start()
    print(runner.addresses[0][1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


def _on_core(core: int | None) -> Any:
    """A `preexec_fn` pinning a child process to `core` (None: leave it where the scheduler puts it)."""
    return None if core is None else (lambda: pin_to(core))


def _start_engine(delay: float, core: int | None) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.record_latency", "--engine", "--delay", str(delay)],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
                               preexec_fn=_on_core(core))
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.strip().isdigit():
        process.kill()
        raise RuntimeError(f"the stand-in engine did not start (exit {process.wait()})")
    return process, f"http://{HOST}:{int(line)}"


def _start_recorder(upstream: str, out: Path, core: int | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench", "record", "--upstream", upstream, "--out", str(out),
                                "--port", str(port)], stderr=subprocess.PIPE, text=True, preexec_fn=_on_core(core))
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
    parser.add_argument("--delay", type=float, default=0.25,
                        help="the stand-in engine's seconds per request (default 0.25: 256 requests/s at 64)")
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="leave the processes unpinned (default: the recorder alone on one core, the client and "
                             "the stand-in engine on another)")
    parser.add_argument("--quick", action="store_true", help="one short round (the test suite's smoke run)")
    parser.add_argument("--out", default="reports/bench")
    args = parser.parse_args(argv)
    if args.engine:
        asyncio.run(_serve_engine(args.delay))
        return 0
    if args.quick:
        args.rounds, args.seconds = 1, 0.5
    bodies = [body for _, body in trace_requests("rlvr-500", None)]
    engine: subprocess.Popen | None = None
    recorder: subprocess.Popen | None = None
    samples: dict[str, list[float]] = {"direct": [], "recorded": []}
    try:
        cores = usable_cores()
        # the recorder on a core of its own, the client and the engine on another (a rollout's node has cores
        # to spare); --no-pin: wherever the scheduler puts them
        recorder_core, client_core = (cores[-1], cores[0]) if args.pin and len(cores) >= 2 else (None, None)
        pin_to(client_core)
        engine, direct = _start_engine(args.delay, client_core)
        with tempfile.TemporaryDirectory() as folder:
            recorder, proxied = _start_recorder(direct, Path(folder) / "recording.jsonl", recorder_core)
            for _ in range(args.rounds):
                for arm, url in (("direct", direct), ("recorded", proxied)):
                    samples[arm] += asyncio.run(_round(url, bodies, args.concurrency, args.seconds, args.delay))
            recorder.send_signal(signal.SIGTERM)
            recorder.wait(timeout=120)
            with open_trace(Path(folder) / "recording.jsonl") as reader:  # the recorder did its whole work
                recorded_turns = sum(len(t.turns) for t in reader)
    finally:
        for process in (recorder, engine):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
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
                                                    "seconds": args.seconds, "delay_s": args.delay,
                                                    "recorder_core": recorder_core, "client_core": client_core,
                                                    "quick": args.quick},
               "added_median_ms": round(added_median, 3), "added_p90_ms": round(added_p90, 3),
               "recorded_turns": recorded_turns, "rows": rows}
    write_results(Path(args.out), "record_latency", payload, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
