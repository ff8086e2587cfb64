"""Admin endpoints and the router surface (WIRE.md sections 2 and 4)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from bench.server import ServerThread
from tests.server_helpers import Reply, request, turn_input


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread("rlvr-500") as thread:
        yield thread


def _generate(thread: ServerThread, index: int = 0, **extra: object) -> Reply:
    trajectory = thread.context.store.trajectories[index]
    return request(thread.url, "/generate", {"input_ids": turn_input(trajectory, 0), **extra},
                   headers={"X-Bench-Trajectory": trajectory.id})


def _in_background(thread: ServerThread, results: list[Reply], index: int = 0) -> threading.Thread:
    worker = threading.Thread(target=lambda: results.append(_generate(thread, index)))
    worker.start()
    deadline = time.monotonic() + 10
    while not thread.context.state.inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread.context.state.inflight, "request never got in flight"
    return worker


def test_health_and_info(server: ServerThread) -> None:
    for path in ("/health", "/health_generate"):
        reply = request(server.url, path)
        assert (reply.status, reply.body) == (200, b"")
    for path in ("/model_info", "/get_model_info"):
        info = request(server.url, path).json()
        assert list(info)[:5] == ["model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
                                  "weight_version"]
    for path in ("/server_info", "/get_server_info"):
        info = request(server.url, path).json()
        assert info["version"] == "0.5.15.post1" and info["context_length"] == 4096
        assert info["disaggregation_mode"] == "null" and isinstance(info["internal_states"], list)
    models = request(server.url, "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == 4096
    assert list(models["data"][0])[:7] == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len"]


def test_weight_version_update_reaches_responses(server: ServerThread) -> None:
    assert request(server.url, "/get_weight_version").json() == {"weight_version": "default"}
    reply = request(server.url, "/update_weight_version", {"new_version": "7"})
    assert reply.json() == {"success": True, "message": "Weight version updated to 7", "new_version": "7"}
    assert request(server.url, "/get_weight_version").json() == {"weight_version": "7"}
    assert _generate(server, 3).json()["meta_info"]["weight_version"] == "7"
    reply = request(server.url, "/update_weights_from_disk", {"model_path": "x", "weight_version": "8"})
    assert reply.json() == {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
    assert request(server.url, "/model_info").json()["weight_version"] == "8"


@pytest.mark.parametrize("options,status,body", [
    ({"sglang_version": "0.5.15", "weight_version_route": "deprecated"}, 404,
     {"object": "error", "message": "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use "
      "'/model_info' instead.", "type": "404", "param": None, "code": 404}),
    ({"sglang_version": "0.5.23"}, 404, {"detail": "Not Found"}),
    ({"sglang_version": "0.5.6"}, 200, {"weight_version": "default"}),
])
def test_weight_version_route_per_release(options: dict, status: int, body: dict) -> None:
    with ServerThread("rlvr-500", **options) as thread:
        reply = request(thread.url, "/get_weight_version")
        assert (reply.status, reply.json()) == (status, body)


def test_update_aborts_requests_in_flight() -> None:
    with ServerThread("rlvr-500", time_scale=100.0) as thread:
        results: list[Reply] = []
        worker = _in_background(thread, results)
        request(thread.url, "/update_weight_version", {"new_version": "2"})
        worker.join(10)
        assert results[0].json()["meta_info"]["finish_reason"]["type"] == "abort"


def test_flush_cache_refuses_while_busy() -> None:
    with ServerThread("rlvr-500", time_scale=100.0) as thread:
        idle = request(thread.url, "/flush_cache", method="POST", raw=b"")
        assert idle.status == 200 and idle.body.startswith(b"Cache flushed.\n")
        results: list[Reply] = []
        worker = _in_background(thread, results)
        busy = request(thread.url, "/flush_cache")
        assert (busy.status, busy.body) == (400, b"Flush cache failed.\n")
        loads = request(thread.url, "/v1/loads?include=core").json()
        load = loads["loads"][0]
        assert load["num_running_reqs"] + load["num_waiting_reqs"] == 1 and loads["version"] == "0.5.15.post1"
        assert request(thread.url, "/get_load").json()[0]["num_reqs"] == 1
        request(thread.url, "/abort_request", {"abort_all": True})
        worker.join(10)


@pytest.mark.parametrize("engine, mode, prefilled, flushed", [
    ("sglang", "retract", False, False),  # upstream: a retracted request waits in the queue, and blocks the flush
    ("sglang", "in_place", True, False),
    ("sglang", "abort", False, True),  # the abort ended it (the engine's pause waits for that): idle
    ("sglang-miles", "retract", False, True),  # miles' fork: paused, nothing running (it went back to the queue)
    ("sglang-miles", "in_place", False, True),  # paused before its first token: still queued
    ("sglang-miles", "in_place", True, False),  # an in-place pause leaves it running
])
def test_flush_cache_while_paused_per_build(engine: str, mode: str, prefilled: bool, flushed: bool) -> None:
    """`/flush_cache` after `/pause_generation` with one request in flight, as each SGLang build decides
    (`bench.server.profiles.ENGINES`): the flush miles' weight sync makes after its retract pause."""
    with ServerThread("rlvr-500", time_scale=10.0, engine=engine) as thread:
        results: list[Reply] = []
        worker = _in_background(thread, results)
        entry = next(iter(thread.context.state.inflight.values()))
        deadline = time.monotonic() + 10
        while prefilled and not entry.prefilled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert entry.prefilled == prefilled
        request(thread.url, "/pause_generation", {"mode": mode})
        reply = request(thread.url, "/flush_cache")
        assert (reply.status, reply.body.startswith(b"Cache flushed.\n")) == (200 if flushed else 400, flushed)
        request(thread.url, "/continue_generation", {})
        request(thread.url, "/abort_request", {"abort_all": True})
        worker.join(10)
        assert results and results[0].status == 200


def test_an_unknown_sglang_build_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown SGLang build 'sglang-nightly'; valid: sglang, sglang-miles"):
        ServerThread("rlvr-500", engine="sglang-nightly")


def test_pause_blocks_new_requests_until_continue() -> None:
    with ServerThread("rlvr-500") as thread:
        paused = request(thread.url, "/pause_generation", {"mode": "in_place"})
        assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
        results: list[Reply] = []
        worker = _in_background(thread, results)
        time.sleep(0.3)
        assert not results, "a request completed while generation was paused"
        resumed = request(thread.url, "/continue_generation", {})
        assert resumed.json() == {"message": "Generation continued successfully.", "status": "ok"}
        worker.join(10)
        assert results[0].status == 200 and results[0].json()["meta_info"]["finish_reason"]["type"] == "length"


def test_pause_in_abort_mode_aborts_in_flight() -> None:
    with ServerThread("rlvr-500", time_scale=100.0) as thread:
        results: list[Reply] = []
        worker = _in_background(thread, results)
        request(thread.url, "/pause_generation", {})
        worker.join(10)
        assert results[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
        request(thread.url, "/continue_generation", {})


def test_prime_rls_weight_update_routes() -> None:
    """prime-rl's vLLM server routes around a weight update: `/pause?mode=keep` holds requests in place until
    `/resume`; `/update_weights` takes the checkpoint's folder, whose `step_<n>` name is the new version."""
    with ServerThread("rlvr-500") as thread:
        assert request(thread.url, "/pause?mode=keep", {}).json() == {"status": "paused"}
        results: list[Reply] = []
        worker = _in_background(thread, results)
        time.sleep(0.3)
        assert not results, "a request completed while generation was paused"
        reply = request(thread.url, "/update_weights", {"weight_dir": "/out/broadcasts/step_3"})
        assert reply.json() == {"status": "ok"}
        assert request(thread.url, "/get_weight_version").json() == {"weight_version": "3"}
        request(thread.url, "/update_weights", {"weight_dir": "/out/elsewhere"})  # not a step folder: no version
        assert request(thread.url, "/get_weight_version").json() == {"weight_version": "3"}
        assert request(thread.url, "/resume", {}).json() == {"status": "resumed"}
        worker.join(10)
        assert results[0].status == 200 and results[0].json()["meta_info"]["weight_version"] == "3"
        assert request(thread.url, "/pause?mode=wait", {}).status == 400


def test_router_surface_lists_itself(server: ServerThread) -> None:
    workers = request(server.url, "/workers").json()
    assert list(workers) == ["workers", "total", "stats"] and workers["total"] == 1
    assert list(workers["workers"][0]) == ["id", "url", "model_id", "priority", "cost", "worker_type", "is_healthy",
                                           "load", "connection_mode", "metadata", "disable_health_check"]
    assert workers["workers"][0]["url"] == server.url
    assert request(server.url, "/list_workers").json() == {"urls": [server.url]}


@pytest.mark.parametrize("router_version", ["0.3.2", "0.2"])
def test_no_available_workers_is_the_routers_503(router_version: str) -> None:
    with ServerThread("rlvr-500", router_version=router_version) as thread:
        assert request(thread.url, "/bench/workers", {"available": False}).status == 200
        reply = _generate(thread)
        assert reply.status == 503
        if router_version == "0.2":
            assert reply.headers["content-type"].startswith("text/plain")
            assert reply.body == b"No available workers (all circuits open or unhealthy)"
        else:
            assert reply.headers["content-type"] == "application/json"
            assert reply.headers["x-smg-error-code"] == "no_available_workers"
            assert reply.headers["x-request-id"].startswith("gnt-") and "retry-after" not in reply.headers
            assert reply.body == (b'{"error":{"type":"Service Unavailable","code":"no_available_workers",'
                                  b'"message":"No available workers (all circuits open or unhealthy)"}}')
        assert request(thread.url, "/readiness").status == 503
        request(thread.url, "/bench/workers", {"available": True})
        assert _generate(thread).status == 200


@pytest.mark.parametrize("version,reported", [("0.4.10", "0.4.10.post2"), ("0.5.2", "0.5.2"), ("0.5.6", "0.5.6"),
                                              ("0.5.15", "0.5.15.post1"), ("0.5.23", "0.5.23")])
def test_info_endpoints_per_release(version: str, reported: str) -> None:
    with ServerThread("rlvr-500", sglang_version=version) as thread:
        assert request(thread.url, "/server_info").json()["version"] == reported
        assert request(thread.url, "/v1/loads").json()["version"] == reported
        info = request(thread.url, "/model_info").json()
        extra = ["served_model_name", "load_format", "reasoning_parser", "tool_call_parser", "disaggregation_mode"]
        assert list(info)[-5:] == extra if version == "0.5.23" else not set(extra) & set(info)
