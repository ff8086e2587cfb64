"""`/bench/*` (swap the plan, read the logs, take workers away) needs the control token whenever the server has one:
always off loopback (generated and printed when not given), on loopback only when given. Tests bind loopback only:
a given token stands in for the generated one, and the off-loopback choice is checked without binding."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.server import BenchServer
from bench.server.control import CONTROL_HEADER, control_token_for, is_loopback
from tests.server_helpers import request


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.7", False), ("example.internal", False)])
def test_only_loopback_binds_go_without_a_token(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    token = control_token_for(host, None)
    assert (token is None) is loopback
    assert token is None or len(token) >= 24
    assert control_token_for(host, "given") == "given"


def test_each_server_off_loopback_gets_its_own_token() -> None:
    first, second = (BenchServer("rlvr-500", host="0.0.0.0") for _ in range(2))  # built, never started
    assert first.control_token and second.control_token and first.control_token != second.control_token
    assert BenchServer("rlvr-500").control_token is None


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        control_token_for("0.0.0.0", " ")


def test_serve_with_a_token_refuses_bench_routes_without_it(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                "--control-token", "s3cret-token", "--log-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://[\d.:]+) ", process.stdout.readline()).group(1)  # type: ignore[union-attr]
        process.stdout.readline()  # type: ignore[union-attr]  # the plan line
        assert process.stdout.readline().strip() == (  # type: ignore[union-attr]
            f"control token for /bench/*: s3cret-token (send it as {CONTROL_HEADER})")
        refused = request(url, "/bench/plan", method="GET")
        wrong = request(url, "/bench/requests", method="GET", headers={CONTROL_HEADER: "s3cret-tokeN"})
        swap = request(url, "/bench/plan", {"faults": ["missing_logprobs"]}, method="PUT")
        by_header = request(url, "/bench/plan", method="GET", headers={CONTROL_HEADER: "s3cret-token"})
        by_bearer = request(url, "/bench/faults", method="GET", headers={"Authorization": "Bearer s3cret-token"})
        health = request(url, "/health", method="GET")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert refused.status == wrong.status == swap.status == 401
    assert refused.json()["error"]["type"] == "bench_control_token" and CONTROL_HEADER in refused.json()["error"]["message"]
    assert by_header.status == by_bearer.status == health.status == 200
    assert by_header.json()["name"] != "runtime"  # the refused PUT swapped nothing
    log = pd.read_csv(tmp_path / "requests.csv")
    assert list(log["status"]) == [401, 401, 401, 200, 200, 200]  # refused requests are logged like the others
    assert process.returncode == 0, err


def test_loopback_serve_needs_no_token(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "ROLLOUT_BENCH_CONTROL_TOKEN": ""})
    try:
        url = re.search(r"at (http://[\d.:]+) ", process.stdout.readline()).group(1)  # type: ignore[union-attr]
        assert request(url, "/bench/plan", method="GET").status == 200
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=15)
    finally:
        process.kill()
    assert "control token" not in out


def test_a_recorder_still_knows_a_token_guarded_mock(tmp_path: Path) -> None:
    """`record` and `proxy` probe `/bench/plan` to learn that the upstream is the bench's mock (its ids are in the
    bench's tokenizer); a refusal for want of the token says so as well as an answer does."""
    import asyncio

    from bench.capture.upstream import probe

    async def probed(token: str | None) -> bool:
        async with BenchServer("rlvr-500", control_token=token) as server:
            return (await probe(server.url)).is_bench_mock

    assert asyncio.run(probed("t0ken")) and asyncio.run(probed(None))


def test_a_bench_route_without_the_token_is_refused_before_its_body_is_read() -> None:
    """The token is checked from the head: a caller without it gets its 401 (and a log row) at once, however big or
    slow the body it announces; the server reads, holds and waits for none of it. (The body was read first: a 10 MB
    body announced and never sent held the request until the body timeout, then got a 408, not a 401.)"""
    import socket

    from bench.server import ServerThread
    from bench.server.limits import Limits

    with ServerThread("rlvr-500", control_token="t0ken", limits=Limits(body_timeout_s=20.0)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"PUT /bench/plan HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 10000000\r\n\r\n{\"faults\": [")  # and nothing more
            conn.settimeout(5)
            head = conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 401"), head[:200]
        assert b"bench_control_token" in head or b"401" in head
        rows = [r for r in server.context.log.records if r.endpoint == "/bench/plan"]
        assert [r.status for r in rows] == [401] and "control token" in str(rows[0].error)
        assert server.context.faults.plan.name != "runtime"
