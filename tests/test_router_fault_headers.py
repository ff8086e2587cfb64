"""The injected router 503 carries the router's own headers (WIRE 4.4), not just its body."""

from __future__ import annotations

import re

from bench.server import ServerThread
from tests.server_helpers import request, turn_input


def test_no_workers_fault_has_the_router_headers() -> None:
    with ServerThread("rlvr-500") as server:
        trajectory = server.context.store.trajectories[0]
        body = {"input_ids": turn_input(trajectory, 0)}
        headers = {"X-Bench-Fault": "router_no_workers", "X-Bench-Trajectory": trajectory.id}
        first = request(server.url, "/generate", body, headers=headers)
        second = request(server.url, "/generate", body, headers=headers)
        assert first.status == second.status == 503
        assert first.headers["x-smg-error-code"] == "no_available_workers" and "retry-after" not in first.headers
        assert re.fullmatch(r"gnt-[A-Za-z0-9]{24}", first.headers["x-request-id"])
        assert first.headers["x-request-id"] != second.headers["x-request-id"]  # a new id per attempt


def test_faults_that_do_not_act_on_one_request_cannot_be_forced() -> None:
    with ServerThread("rlvr-500") as server:
        for fault, where in (("stale_retry", "the target adapter"), ("abort_all_on_weight_update", "weight updates")):
            reply = request(server.url, "/generate", {"text": "hi"}, headers={"X-Bench-Fault": fault})
            assert reply.status == 400 and f"acts in {where}" in reply.json()["error"]["message"]
