"""The real sglang-router (PyPI) in front of two bench servers: routing, then its own breaker's 503."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.server import ServerThread
from tests.router_helpers import free_port as _free_port
from tests.router_helpers import wait_ready as _wait_ready
from tests.server_helpers import Reply, request, turn_input

NO_WORKERS = (b'{"error":{"type":"Service Unavailable","code":"no_available_workers",'
              b'"message":"No available workers (all circuits open or unhealthy)"}}')


@pytest.mark.slow
def test_router_routes_to_bench_workers_then_opens_its_circuit(tmp_path: Path) -> None:
    try:
        import sglang_router
    except ImportError:
        pytest.skip("sglang-router has no wheel for this platform: the real-router test did not run")
    assert sglang_router.__version__ == "0.3.2"
    port, metrics = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "router.log"
    router: subprocess.Popen | None = None
    try:
        with ServerThread("rlvr-500") as first, ServerThread("rlvr-500") as second:
            command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                       "--port", str(port), "--worker-urls", first.url, second.url, "--policy", "round_robin",
                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), "--log-level", "warn",
                       "--disable-retries", "--cb-failure-threshold", "1", "--health-check-interval-secs", "60"]
            with open(log, "wb") as sink:
                router = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
            _wait_ready(router, url, log)
            store = first.context.store
            for index in range(4):
                trajectory = store.trajectories[index * 4]  # one member of four different groups
                reply = request(url, "/generate", {"input_ids": turn_input(trajectory, 0), "return_logprob": True,
                                                   "sampling_params": {"max_new_tokens": 1024}})
                assert reply.status == 200, reply.body
                ids = [t[1] for t in reply.json()["meta_info"]["output_token_logprobs"]]
                assert ids == list(trajectory.turns[0].output_ids)
            served = [[r for r in s.context.log.records if r.endpoint == "/generate"] for s in (first, second)]
            # round robin reaches both workers (a slow probe under load can shift one request: no exact split)
            assert sum(len(s) for s in served) == 4 and min(len(s) for s in served) >= 1
            assert all(r.drift is None and r.turn == 0 for s in served for r in s)
        # Both workers are stopped now: the router meets refused connections, then opens its circuits.
        replies: list[Reply] = []
        for _ in range(6):
            replies.append(request(url, "/generate", {"text": "hello"}))
            if replies[-1].status == 503:
                break
        failed, final = replies[:-1], replies[-1]
        assert failed and all(r.status == 500 for r in failed)
        assert all(r.headers.get("x-smg-error-code") == "call_upstream_request_error" for r in failed)
        assert final.status == 503, [(r.status, r.body) for r in replies]
        assert final.headers["x-smg-error-code"] == "no_available_workers"
        assert final.body == NO_WORKERS
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=20)
