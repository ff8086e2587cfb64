"""A closed-loop HTTP/1.1 load generator: C keep-alive connections, each sending its next request on an answer
(or, with `think`, that many seconds after it: requests spaced out as a rollout sends them).

Why not aiohttp's client: on one core of the 2-core machine it tops out near 5.4k requests/s with the
server below 90% of its core, so it measured itself, not the server. This one writes pre-built request
bytes and reads only the status line and the framing (Content-Length, chunked, or until close), a few
microseconds per answer, so the server's core is the limit. A connection the server drops (a reset or a
truncated body fault) counts as `dropped` and is replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


def raw_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one POST with a JSON body, ready to write on a keep-alive connection."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Tally:
    """Answers so far, by status (`dropped`: the connection ended without a whole answer)."""

    answers: int = 0
    statuses: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> tuple[int, Counter[str]]:
        return self.answers, Counter(self.statuses)


class _Connection(asyncio.Protocol):
    def __init__(self, load: "Load") -> None:
        self.load = load
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.status = ""
        self.need: int | None = None  # bytes of the whole answer, once its header is read
        self.chunked = self.until_close = self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.load.connections.add(self)
        self._send()

    def _send(self) -> None:
        if self.load.stopping:
            self.transport.close()  # type: ignore[union-attr]
            return
        self.buffer.clear()
        self.need, self.chunked, self.until_close = None, False, False
        self.transport.write(next(self.load.requests))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.need is None and not self.chunked and not self.until_close and not self._read_header():
                return
            if self.chunked:
                end = self.buffer.find(b"\r\n0\r\n\r\n")  # JSON bodies hold no raw CRLF: only framing does
                if end < 0:
                    return
                rest = bytes(self.buffer[end + 7:])
            elif self.until_close:
                return
            else:
                assert self.need is not None
                if len(self.buffer) < self.need:
                    return
                rest = bytes(self.buffer[self.need:])
            self.load.count(self.status)
            if self.close_after:
                self.transport.close()  # type: ignore[union-attr]
                return
            if self.load.think is not None:
                asyncio.get_running_loop().call_later(self.load.think(), self._send_if_open)
                return
            self._send()
            if not rest:
                return
            self.buffer += rest

    def _send_if_open(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._send()

    def _read_header(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        self.status = head[0].split(" ", 2)[1] if head[0].count(" ") else "?"
        headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in head[1:])}
        self.close_after = headers.get("connection") == "close"
        del self.buffer[: end + 4]
        if "content-length" in headers:
            self.need = int(headers["content-length"])
        elif headers.get("transfer-encoding") == "chunked":
            self.chunked = True
            self.buffer[:0] = b"\r\n"  # so the first chunk of an empty body matches the terminator too
        else:
            self.until_close = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.connections.discard(self)
        if self.until_close and self.status:
            self.load.count(self.status)
        elif not self.load.stopping and not self.close_after:
            self.load.count("dropped")
        self.load.reconnect()


class Load:
    """C connections to (host, port), cycling through `requests`, until `stop()`; with `think`, each connection waits
    `think()` seconds after an answer before its next request."""

    def __init__(self, host: str, port: int, requests: Sequence[bytes], concurrency: int,
                 think: Callable[[], float] | None = None) -> None:
        if not requests:
            raise ValueError("the load generator needs at least one request")
        self.host, self.port, self.concurrency, self.think = host, port, concurrency, think
        self.requests = itertools.cycle(requests)
        self.tally = Tally()
        self.stopping = False
        self._pending: set[asyncio.Task[object]] = set()
        self.connections: set[_Connection] = set()

    def count(self, status: str) -> None:
        self.tally.answers += 1
        self.tally.statuses[status] += 1

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.create_connection(lambda: _Connection(self), self.host, self.port)
                               for _ in range(self.concurrency)))

    def reconnect(self) -> None:
        if self.stopping:
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.create_connection(lambda: _Connection(self), self.host, self.port))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def stop(self, grace_s: float = 2.0) -> None:
        """No new requests; let the answers in flight arrive (up to `grace_s`), then close what is left,
        so the server is idle before the next measurement."""
        self.stopping = True
        deadline = time.monotonic() + grace_s
        while (self._pending or self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self._pending):
            task.cancel()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.sleep(0.05)


def measure_rounds(host: str, servers: dict[str, tuple[int, Callable[[], float]]], kinds: Sequence[str],
                   requests: Sequence[bytes], args: Any, interleave: Callable[[Sequence[str], int], Any]
                   ) -> dict[str, list[dict[str, Any]]]:
    """`args.rounds` interleaved rounds of one `measure` window per server (`servers`: kind -> (port, its CPU
    seconds)), each printed as it ends; the windows per kind."""
    windows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    width = max(len(kind) for kind in kinds)
    for round_index, kind in interleave(kinds, args.rounds):
        port, cpu = servers[kind]
        window = asyncio.run(measure(host, port, requests, args.concurrency, args.warmup, args.seconds, cpu))
        windows[kind].append(window)
        print(f"  round {round_index + 1} {kind:<{width}} {window['requests_per_s']:8.0f} req/s, "
              f"server CPU {window['server_cpu_share']:.2f}, load generator CPU {window['client_cpu_share']:.2f}",
              flush=True)
    return windows


async def measure(host: str, port: int, requests: Sequence[bytes], concurrency: int, warmup_s: float, seconds: float,
                  server_cpu_s: Callable[[], float], think: Callable[[], float] | None = None) -> dict[str, Any]:
    """One window: warm up, then count answers, the server's CPU time (`server_cpu_s()` read before and after)
    and this process's (the load generator's) over `seconds`. A server CPU share below 1.0 with the client's
    near 1.0 means the load generator, not the server, set the rate (unless `think` spaces the requests out)."""
    load = Load(host, port, requests, concurrency, think)
    await load.start()
    await asyncio.sleep(warmup_s)
    answers0, statuses0 = load.tally.snapshot()
    cpu0, client0, wall0 = server_cpu_s(), time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    answers1, statuses1 = load.tally.snapshot()
    cpu1, client1, wall1 = server_cpu_s(), time.process_time(), time.perf_counter()
    await load.stop()
    wall, answers = wall1 - wall0, answers1 - answers0
    statuses = statuses1 - statuses0
    return {"requests_per_s": answers / wall, "answers": answers, "wall_s": wall,
            "server_cpu_share": (cpu1 - cpu0) / wall, "client_cpu_share": (client1 - client0) / wall,
            "server_cpu_us_per_answer": 1e6 * (cpu1 - cpu0) / answers if answers else float("nan"),
            "statuses": dict(sorted(statuses.items()))}
