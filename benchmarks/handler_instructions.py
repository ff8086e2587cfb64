"""`python -m benchmarks.handler_instructions KIND`: a server's own work per request, with no socket, for counting.

The wall-clock benchmark (`server_throughput`) measures CPU time, which on a shared 2-core machine moves with the
load; instruction counts do not. This drives one server of `throughput_servers` (bare-bytes, bench or bench-plan)
through aiohttp's own protocol over in-memory transports: its HTTP parser, router, handler, response prepare and
writing, with `--connections` keep-alive connections each sending its next request when the answer is whole (the
benchmark's closed loop; a connection the server drops is replaced). The requests are `server_throughput`'s
(rlvr-500's turn-0 prompts), so the bare server answers the bench's own reply bytes.

Under callgrind with `--callgrind`, the warm-up runs uninstrumented and the harness has callgrind (through
`callgrind_control`) dump an empty window, then the measured requests' window: the second dump's total less the
first's, over `--measured`, is the instructions per request (the client side of these transports, a few thousand
instructions a request, is counted too, alike for every kind)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.out \
        python -m benchmarks.handler_instructions bench --callgrind
    grep ^summary /tmp/cg.out.1 /tmp/cg.out.2   # empty window, measured window

Without valgrind it prints the process CPU time of the measured requests (noisy on a loaded machine) and, with
`--profile FILE`, writes a cProfile of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from collections import Counter
from typing import Any

from aiohttp import web

from .http_load import raw_request
from .server_throughput import HOST, WAITING_FAULTS, trace_requests
from .throughput_servers import TRAJECTORY_HEADER, _bare_app, bench_plan


class _Transport(asyncio.Transport):
    """One in-memory connection: what the server writes is read back for its framing; a whole answer sends the
    connection's next request."""

    def __init__(self, driver: "_Driver") -> None:
        super().__init__()
        self.driver = driver
        self.protocol: Any = None
        self.buffer = bytearray()
        self.closing = False
        self.waiting = False  # a request was sent and its answer is not whole yet

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: Any) -> None:
        if self.closing:
            return
        self.buffer += data
        self._answered()

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        self._lost()

    def abort(self) -> None:
        self._lost()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: Any = None, low: Any = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def _answered(self) -> None:
        """A whole answer read back (cheaply: this client's work is counted with the server's)."""
        buffer = self.buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        at = buffer.find(b"Content-Length: ", 0, head_end)
        length = 0 if at < 0 else int(buffer[at + 16: buffer.find(b"\r\n", at)])
        end = head_end + 4 + length
        if len(buffer) < end:
            return
        answer = bytes(buffer[:end])
        del buffer[:end]
        self.driver.answered(self, answer)

    def _lost(self) -> None:
        if self.closing:
            return
        self.closing = True
        loop = asyncio.get_running_loop()
        loop.call_soon(self.protocol.connection_lost, None)
        self.driver.dropped(self)


class _Driver:
    """Keeps `connections` requests in flight until `total` answers came back."""

    def __init__(self, server: web.Server, requests: list[bytes], connections: int) -> None:
        self.server = server
        self.requests = requests
        self.connections = connections
        self.next = 0
        self.sent = 0  # requests written and not lost with a dropped connection
        self.answers = 0
        self.target = 0
        self.statuses: Counter[str] = Counter()
        self.done: asyncio.Future[None] | None = None
        self.open: set[_Transport] = set()
        self.last = b""  # the latest answer, head and body

    def _send(self, transport: _Transport) -> None:
        if self.sent >= self.target or transport.closing:
            return
        self.sent += 1
        transport.waiting = True
        request = self.requests[self.next % len(self.requests)]
        self.next += 1
        asyncio.get_running_loop().call_soon(transport.protocol.data_received, request)

    def connect(self) -> None:
        transport = _Transport(self)
        transport.protocol = self.server()
        transport.protocol.connection_made(transport)
        self.open.add(transport)
        self._send(transport)

    def answered(self, transport: _Transport, answer: bytes) -> None:
        transport.waiting = False
        self.answers += 1
        self.statuses[answer[9:12].decode()] += 1
        self.last = answer
        if self.answers >= self.target:
            if self.done is not None and not self.done.done():
                self.done.set_result(None)
            return
        self._send(transport)

    def dropped(self, transport: _Transport) -> None:
        self.open.discard(transport)
        if self.answers >= self.target:  # closed when the server shuts down
            return
        self.statuses["dropped"] += 1
        if transport.waiting:  # its request was in flight: never answered
            self.sent -= 1
        if self.answers < self.target:
            asyncio.get_running_loop().call_soon(self.connect)

    async def run(self, count: int) -> None:
        """Until `count` more answers came back (the connections stay open between calls)."""
        self.target = self.answers + count
        self.done = asyncio.get_running_loop().create_future()
        if not self.open:
            for _ in range(self.connections):
                self.connect()
        else:
            for transport in list(self.open):
                self._send(transport)
        await self.done
        for _ in range(20):  # the handlers' last steps (nothing is in flight: `sent` stops at the target)
            await asyncio.sleep(0)


def _app(kind: str, args: argparse.Namespace, bodies: dict[str, tuple[int, Any]] | None) -> web.Application:
    if kind == "bare-bytes":
        assert bodies is not None
        return _bare_app(kind, bodies)
    from bench.server.app import create_app, load_context

    plan = bench_plan(args.plan, [w for w in args.without.split(",") if w]) if kind == "bench-plan" else None
    context = load_context(args.trace, plan=plan)
    context.fast_path = not args.slow_path
    return create_app(context)


async def _bodies(args: argparse.Namespace, requests: list[tuple[str, bytes]]) -> dict[str, tuple[int, Any]]:
    """The bench's reply to each request (what bare-bytes answers), through the same in-memory transports."""
    from bench.server.app import create_app, load_context

    runner = web.AppRunner(create_app(load_context(args.trace)), handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None
    replies: dict[str, tuple[int, Any]] = {}
    for trajectory, body in requests:
        raw = raw_request(HOST, 0, "/generate", body, {TRAJECTORY_HEADER: trajectory})
        driver = _Driver(runner.server, [raw], 1)
        await driver.run(1)
        head, _, payload = driver.last.partition(b"\r\n\r\n")
        replies[trajectory] = (int(head[9:12]), json.loads(payload))
    await runner.cleanup()
    return replies


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    requests = trace_requests(args.trace, args.requests)
    raw = [raw_request(HOST, 0, "/generate", body, {TRAJECTORY_HEADER: trajectory}) for trajectory, body in requests]
    bodies = await _bodies(args, requests) if args.kind == "bare-bytes" else None
    runner = web.AppRunner(_app(args.kind, args, bodies), handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None
    driver = _Driver(runner.server, raw, args.connections)
    await driver.run(args.warm_up)
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    if args.callgrind:  # the warm-up ran uninstrumented (faster); an empty window first: the controlling's own cost
        _callgrind("--instr=on", "--zero", "--dump=empty", "--zero")
    cpu = time.process_time()
    if args.measured:
        await driver.run(args.measured)
    cpu = time.process_time() - cpu
    if args.callgrind:
        _callgrind("--dump=measured")
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    await runner.cleanup()
    return {"kind": args.kind, "warm_up": args.warm_up, "measured": args.measured, "answers": driver.answers,
            "statuses": dict(driver.statuses), "cpu_us_per_request": round(cpu / max(1, args.measured) * 1e6, 1)}


def _callgrind(*options: str) -> None:
    """Ask the callgrind running this process (`valgrind --tool=callgrind --instr-atstart=no`) to act, and wait."""
    for option in options:
        subprocess.run(["callgrind_control", option, str(os.getpid())], check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.handler_instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("bare-bytes", "bench", "bench-plan"))
    parser.add_argument("--trace", default="rlvr-500")
    parser.add_argument("--requests", type=int, help="use only the first N trajectories' requests (default all)")
    parser.add_argument("--plan", default="chaos")
    parser.add_argument("--without", default=WAITING_FAULTS)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--warm-up", type=int, default=1000, help="answers before the measured ones (1000)")
    parser.add_argument("--measured", type=int, default=1000, help="answers measured (1000; 0: warm-up only)")
    parser.add_argument("--slow-path", action="store_true", help="bench kinds: every request on the slow path")
    parser.add_argument("--callgrind", action="store_true",
                        help="under `valgrind --tool=callgrind --instr-atstart=no`: count the measured requests only")
    parser.add_argument("--profile", help="write a cProfile of the measured requests here")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_main(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
