"""The server's limits hold and each refusal is logged: a body too big (413) or too slow (408), a request head that
never completes (closed after the head timeout), connections past the limit (closed as they arrive)."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.server import BenchServer
from bench.server.limits import Limits


def _host_port(server: BenchServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def _exchange(server: BenchServer, raw: bytes, wait_s: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection(*_host_port(server))
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), wait_s)
    finally:
        writer.close()


def test_a_body_past_the_size_limit_is_413_and_logged() -> None:
    async def go() -> tuple[bytes, list]:
        async with BenchServer("rlvr-500", limits=Limits(max_body_mb=0.01)) as server:
            body = b'{"input_ids": [' + b"1," * 10_000 + b'1]}'
            head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            answer = await _exchange(server, head.encode() + body)
            return answer, [(r.endpoint, r.status, r.error) for r in server.log.records]

    answer, rows = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than the server's limit of 0.01 MB" in answer
    assert rows == [("/generate", 413, "the request body is larger than the server's limit of 0.01 MB")]


def test_a_body_that_stops_arriving_is_408_and_logged() -> None:
    async def go() -> tuple[bytes, float, list]:
        async with BenchServer("rlvr-500", limits=Limits(body_timeout_s=0.5)) as server:
            head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            started = time.monotonic()
            answer = await _exchange(server, head + b'{"input_ids"')
            return answer, time.monotonic() - started, [(r.endpoint, r.status) for r in server.log.records]

    answer, took, rows = asyncio.run(go())
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
    assert 0.5 <= took < 3 and rows == [("/generate", 408)]


@pytest.mark.parametrize("after_a_request", [False, True])
def test_a_head_that_never_completes_is_closed(after_a_request: bool) -> None:
    """Slowloris: a head sent a byte at a time is cut off after the head timeout, first request or later."""
    async def go() -> float:
        async with BenchServer("rlvr-500", limits=Limits(head_timeout_s=0.5)) as server:
            reader, writer = await asyncio.open_connection(*_host_port(server))
            started = time.monotonic()
            if after_a_request:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                except ConnectionError:  # the server closed it while we were still writing: what is tested
                    break
                await asyncio.sleep(0.05)
                if reader.at_eof() or time.monotonic() - started > 5:
                    break
            await asyncio.wait_for(reader.read(), 1)  # the server has closed it: EOF
            writer.close()
            return time.monotonic() - started

    assert asyncio.run(go()) < 3


def test_connections_past_the_limit_are_closed_as_they_arrive() -> None:
    async def go() -> tuple[list[bytes], int, bytes]:
        async with BenchServer("rlvr-500", limits=Limits(max_connections=2)) as server:
            opened = [await asyncio.open_connection(*_host_port(server)) for _ in range(3)]
            answers = []
            for reader, writer in opened:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                answers.append(await asyncio.wait_for(reader.read(12), 5))
            for _, writer in opened:
                writer.close()
            await asyncio.sleep(0.2)  # the first two are gone: a new one is served
            again = await _exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert server.site is not None and server.site.guard is not None
            return answers, server.site.guard.refused, again

    answers, refused, again = asyncio.run(go())
    assert answers[:2] == [b"HTTP/1.1 200"] * 2 and answers[2] == b"" and refused == 1
    assert again.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("field, value", [("max_body_mb", 0), ("head_timeout_s", float("inf")),
                                          ("body_timeout_s", -1), ("max_connections", 0), ("max_connections", 2.5)])
def test_limits_refuse_values_that_mean_nothing(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


@pytest.mark.parametrize("option, value, message", [("--head-timeout", "inf", "--head-timeout must be a finite"),
                                                    ("--max-connections", "0", "--max-connections must be an integer"),
                                                    ("--max-body-mb", "-1", "--max-body-mb must be a finite")])
def test_serve_names_the_limit_option_it_refuses(option: str, value: str, message: str) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "bench", "serve", "--port", "0", option, value], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr
