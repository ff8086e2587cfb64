"""`python -m benchmarks.throughput_servers KIND --core N ...`: one server of the throughput benchmark, alone
in its process (pinned to one core), so the load generator's CPU is never counted as the server's.

KIND is one of:
  bare-bytes  bare aiohttp, one route answering with precomputed body bytes (the ceiling)
  bare-json   bare aiohttp building the same body per request (a fresh dict, `json.dumps`)
  bench       the bench server (`BenchServer`) replaying the trace, no fault plan
  bench-plan  the bench server with a fault plan (`--plan`, minus the rules of `--without`)
  bare-protocol  no HTTP framework: an asyncio protocol writing the precomputed answer bytes (what the machine's
              sockets and event loop cost alone; `spaced_requests` uses it)

The bare kinds answer with the bench's own replies (`--bodies`: a JSON map from trajectory id to
[status, reply], fetched from the bench server first), so every kind sends the same bytes per request;
they answer on `--route` (`/generate`, or `/v1/chat/completions` beside the peers in `peer_servers`).
Prints one JSON line {"pid", "port", "core"} once listening; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from .common import pin_to

KINDS = ("bare-bytes", "bare-json", "bench", "bench-plan")  # what server_throughput compares
SERVER_KINDS = (*KINDS, "bare-protocol")
TRAJECTORY_HEADER = "X-Bench-Trajectory"  # what reference targets send (bench.server.context)


def _bare_app(kind: str, bodies: dict[str, tuple[int, Any]], route: str = "/generate") -> web.Application:
    app = web.Application()
    if kind == "bare-bytes":
        table = {key: (status, json.dumps(reply, separators=(",", ":")).encode())
                 for key, (status, reply) in bodies.items()}

        async def precomputed(request: web.Request) -> web.Response:
            await request.read()
            status, body = table[request.headers[TRAJECTORY_HEADER]]
            return web.Response(body=body, status=status, content_type="application/json")

        app.router.add_post(route, precomputed)
    else:
        async def built(request: web.Request) -> web.Response:
            arrived = time.time()
            await request.read()
            status, reply = bodies[request.headers[TRAJECTORY_HEADER]]
            meta = dict(reply["meta_info"], id=uuid.uuid4().hex, e2e_latency=time.time() - arrived)
            body = json.dumps({**reply, "meta_info": meta}, separators=(",", ":")).encode()
            return web.Response(body=body, status=status, content_type="application/json")

        app.router.add_post(route, built)
    return app


def bench_plan(name: str, without: list[str]) -> Any:
    """A shipped plan minus the rules of the named fault types (e.g. the ones that only wait)."""
    from faults import Plan, resolve_plan

    plan = resolve_plan(name)
    unknown = sorted(set(without) - {r.fault.name for r in plan.rules})
    if unknown:
        raise ValueError(f"--without: plan {name!r} has no rule of fault type(s) {', '.join(unknown)}")
    rules = tuple(r for r in plan.rules if r.fault.name not in without)
    label = f"{name} without {','.join(without)}" if without else name
    return Plan(label, plan.seed, rules, plan.description, plan.source)


class _BareProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive requests answered with precomputed bytes, parsed just enough to frame them: the floor of
    serving from Python on this machine, under any framework."""

    def __init__(self, answers: dict[bytes, bytes]) -> None:
        self.answers = answers
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length, trajectory = 0, b""
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == _TRAJECTORY_NAME:
                    trajectory = value.strip()
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            assert self.transport is not None
            self.transport.write(self.answers[trajectory])


_TRAJECTORY_NAME = TRAJECTORY_HEADER.lower().encode()


def _protocol_answers(bodies: dict[str, tuple[int, Any]]) -> dict[bytes, bytes]:
    """Each trajectory's whole answer (status line, headers, body) as bytes."""
    answers = {}
    for key, (status, reply) in bodies.items():
        body = json.dumps(reply, separators=(",", ":")).encode()
        head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        answers[key.encode()] = head.encode() + body
    return answers


async def _serve_protocol(args: argparse.Namespace, bodies: dict[str, tuple[int, Any]]) -> None:
    answers = _protocol_answers(bodies)
    server = await asyncio.get_running_loop().create_server(lambda: _BareProtocol(answers), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"pid": os.getpid(), "port": port, "core": args.pinned}), flush=True)
    await _until_signalled()
    server.close()
    await server.wait_closed()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve(args: argparse.Namespace) -> None:
    if args.kind.startswith("bare"):
        bodies = {k: (int(v[0]), v[1]) for k, v in json.loads(Path(args.bodies).read_text()).items()}
        if args.kind == "bare-protocol":
            await _serve_protocol(args, bodies)
            return
        runner = web.AppRunner(_bare_app(args.kind, bodies, args.route), handler_cancellation=True, access_log=None)
    else:
        from bench.server.app import create_app, load_context

        plan = bench_plan(args.plan, args.without) if args.kind == "bench-plan" else None
        context = load_context(args.trace, plan=plan, time_scale=args.time_scale)
        runner = web.AppRunner(create_app(context), handler_cancellation=True, access_log=None)  # as BenchServer
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(json.dumps({"pid": os.getpid(), "port": port, "core": args.pinned}), flush=True)
    await _until_signalled()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput_servers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=SERVER_KINDS)
    parser.add_argument("--core", type=int, help="pin to this core (a core number)")
    parser.add_argument("--bodies", help="bare kinds: JSON map trajectory id -> [status, reply]")
    parser.add_argument("--route", default="/generate", help="bare kinds: the path answered (/generate)")
    parser.add_argument("--trace", default="rlvr-500", help="bench kinds: the trace to replay")
    parser.add_argument("--time-scale", type=float, default=0.0,
                        help="bench kinds: pace answers at the recorded latencies times this (0: at once)")
    parser.add_argument("--plan", default="chaos", help="bench-plan: a shipped plan name or TOML file")
    parser.add_argument("--without", default="", help="bench-plan: comma-separated fault types to leave out")
    args = parser.parse_args(argv)
    args.without = [w for w in args.without.split(",") if w]
    if args.kind.startswith("bare") and not args.bodies:
        parser.error(f"{args.kind} needs --bodies")
    args.pinned = pin_to(args.core)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
