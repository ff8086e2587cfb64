"""SGLang native `/generate` conformance against WIRE.md, for every version profile."""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import pytest

from bench.server import PROFILES, ServerThread
from tests.server_helpers import request, turn_input

EOS = 1758

# WIRE.md 1.2: meta_info key order of a finished item with logprobs on.
META_KEYS = {
    "0.4.10": ["id", "finish_reason", "prompt_tokens", "input_token_logprobs", "output_token_logprobs",
               "completion_tokens", "cached_tokens", "e2e_latency"],
    "0.5.2": ["id", "finish_reason", "prompt_tokens", "weight_version", "input_token_logprobs",
              "output_token_logprobs", "completion_tokens", "cached_tokens", "e2e_latency"],
    "0.5.6": ["id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions", "input_token_logprobs",
              "output_token_logprobs", "completion_tokens", "cached_tokens", "e2e_latency",
              "response_sent_to_client_ts"],
    "0.5.15": ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "input_token_logprobs",
               "output_token_logprobs", "output_token_logprobs_length", "reasoning_tokens", "completion_tokens",
               "cached_tokens", "cached_tokens_details", "dp_rank", "e2e_latency", "response_sent_to_client_ts"],
}
META_KEYS["0.5.23"] = META_KEYS["0.5.15"]
TOP_KEYS = {name: ["text", "meta_info"] if name == "0.4.10" else ["text", "output_ids", "meta_info"]
            for name in PROFILES}


@pytest.fixture(scope="module", params=sorted(PROFILES))
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    with ServerThread("rlvr-500", sglang_version=request.param) as thread:
        yield thread


def _traj(server: ServerThread, index: int = 0):  # type: ignore[no-untyped-def]
    return server.context.store.trajectories[index]


def _send(server: ServerThread, trajectory, body: dict):  # type: ignore[no-untyped-def]
    """POST /generate as `trajectory` (members of a group send identical turn-0 requests)."""
    return request(server.url, "/generate", body, headers={"X-Bench-Trajectory": trajectory.id})


def _body(ids: list[int], **extra: object) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 1024, "stop_token_ids": [EOS],
                                                   "no_stop_trim": True}, "return_logprob": True, **extra}


def test_replayed_item_matches_the_wire_shape(server: ServerThread) -> None:
    profile = server.context.config.profile
    trajectory = _traj(server)
    reply = _send(server, trajectory, _body(turn_input(trajectory, 0)))
    assert reply.status == 200 and reply.headers["content-type"].startswith("application/json")
    assert b": " not in reply.body[:40] and b", " not in reply.body[:200]  # compact JSON
    item = reply.json()
    assert list(item) == TOP_KEYS[profile.name]
    meta = item["meta_info"]
    assert list(meta) == META_KEYS[profile.name]
    recorded = trajectory.turns[0]
    ids = [t[1] for t in meta["output_token_logprobs"]]
    assert ids == list(recorded.output_ids) and ids[-1] == EOS
    assert [t[0] for t in meta["output_token_logprobs"]] == list(recorded.logprobs)
    assert all(len(t) == 3 and t[2] is None for t in meta["output_token_logprobs"])
    assert meta["completion_tokens"] == len(ids)
    if profile.output_ids:
        assert item["output_ids"] == ids
    if profile.output_logprobs_length:
        assert meta["output_token_logprobs_length"] == len(ids)
    assert item["text"] == recorded.text and "<|im_end|>" not in item["text"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert meta["prompt_tokens"] == recorded.input_len
    assert len(meta["id"]) == 32 and int(meta["id"], 16) >= 0
    expected_input = [[None, turn_input(trajectory, 0)[-1], None]] if profile.legacy_input_logprobs else []
    assert meta["input_token_logprobs"] == expected_input


def test_without_return_logprob_the_keys_are_absent(server: ServerThread) -> None:
    reply = request(server.url, "/generate", {"input_ids": turn_input(_traj(server, 1), 0)})
    meta = reply.json()["meta_info"]
    assert not any("logprob" in key for key in meta)
    assert meta["finish_reason"]["type"] in ("stop", "length")


def test_max_new_tokens_cuts_with_a_length_finish(server: ServerThread) -> None:
    trajectory = _traj(server, 2)
    body = _body(turn_input(trajectory, 0))
    body["sampling_params"]["max_new_tokens"] = 5
    meta = _send(server, trajectory, body).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert [t[1] for t in meta["output_token_logprobs"]] == list(trajectory.turns[0].output_ids[:5])
    assert meta["completion_tokens"] == 5


def test_stop_string_is_trimmed_from_text_only_without_no_stop_trim(server: ServerThread) -> None:
    trajectory = _traj(server, 3)
    recorded = trajectory.turns[0]
    stop = recorded.text.split()[3]
    for no_trim in (False, True):
        body = _body(turn_input(trajectory, 0))
        body["sampling_params"].update(stop=[stop], no_stop_trim=no_trim)
        item = _send(server, trajectory, body).json()
        assert item["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert item["text"].endswith(stop) == no_trim
        assert stop not in item["text"][:-len(stop)] if no_trim else stop not in item["text"]


def test_text_in_logprobs(server: ServerThread) -> None:
    body = _body(turn_input(_traj(server, 4), 0), return_text_in_logprobs=True)
    item = _send(server, _traj(server, 4), body).json()
    triples = item["meta_info"]["output_token_logprobs"]
    assert "".join(t[2] for t in triples[:-1]) == item["text"]


def test_batch_and_n_expand_into_arrays(server: ServerThread) -> None:
    a, b = turn_input(_traj(server, 8), 0), turn_input(_traj(server, 12), 0)
    items = request(server.url, "/generate", _body([a, b])).json()
    assert isinstance(items, list) and len(items) == 2
    assert [i["meta_info"]["prompt_tokens"] for i in items] == [len(a), len(b)]
    body = _body(a, rid="client-rid")
    body["sampling_params"]["n"] = 3
    items = request(server.url, "/generate", body).json()
    ids = [i["meta_info"]["id"] for i in items]
    assert len(items) == 3 and len(set(ids)) == 3 and "client-rid" not in ids


def test_stream_is_cumulative_sse_ending_in_done(server: ServerThread) -> None:
    profile = server.context.config.profile
    trajectory = _traj(server, 16)
    reply = _send(server, trajectory, _body(turn_input(trajectory, 0), stream=True))
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = reply.events()
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    recorded = list(trajectory.turns[0].output_ids)
    assert len(chunks) == len(recorded)  # one chunk per token
    for count, chunk in enumerate(chunks, start=1):
        meta = chunk["meta_info"]
        assert [t[1] for t in meta["output_token_logprobs"]] == recorded[:count]
        if profile.output_ids:
            assert chunk["output_ids"] == recorded[:count]
        final = count == len(chunks)
        assert (meta["finish_reason"] is None) != final
        assert ("e2e_latency" in meta) == final
        assert ("response_sent_to_client_ts" in meta) == (profile.response_sent_ts and count == 1)
    assert chunks[-1]["text"] == trajectory.turns[0].text


def test_incremental_stream_sends_deltas() -> None:
    with ServerThread("rlvr-500", incremental_streaming=True) as thread:
        trajectory = thread.context.store.trajectories[0]
        reply = _send(thread, trajectory, _body(turn_input(trajectory, 0), stream=True))
        chunks = [json.loads(e) for e in reply.events()[:-1]]
        assert all(len(c["output_ids"]) == 1 for c in chunks)
        assert [c["output_ids"][0] for c in chunks] == list(trajectory.turns[0].output_ids)
        assert "".join(c["text"] for c in chunks) == trajectory.turns[0].text


def test_context_length_error_plain_and_in_band(server: ServerThread) -> None:
    profile = server.context.config.profile
    limit = server.context.config.context_length
    ids = turn_input(_traj(server, 20), 0)
    body = _body(ids)
    body["sampling_params"]["max_new_tokens"] = limit
    reply = request(server.url, "/generate", body)
    total = len(ids) + limit
    assert reply.status == 400
    assert reply.json() == {"error": {"message": (
        f"Requested token count exceeds the model's maximum context length of {limit} tokens. You requested a total "
        f"of {total} tokens: {len(ids)} tokens from the input messages and {limit} tokens for the completion. "
        "Please reduce the number of tokens in the input messages or the completion to fit within the limit.")}}
    long = _body([5] * limit, stream=True)
    reply = request(server.url, "/generate", long)
    assert reply.status == 200
    error, done = reply.events()
    message = f"The input ({limit} tokens) is longer than the model's context length ({limit} tokens)."
    expected = ({"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
                if profile.rich_stream_errors else {"message": message})
    assert json.loads(error) == {"error": expected} and done == b"[DONE]"


def test_request_log_identifies_turn_and_attempt(server: ServerThread) -> None:
    trajectory = _traj(server, 40)
    before = len(server.context.log)
    for _ in range(2):
        _send(server, trajectory, _body(turn_input(trajectory, 0)))
    records = [r for r in server.context.log.records[before:] if r.endpoint == "/generate"]
    assert [(r.trajectory, r.turn, r.attempt, r.status) for r in records] == [
        (trajectory.id, 0, 1, 200), (trajectory.id, 0, 2, 200)]


def test_queued_and_running_aborts() -> None:
    """A request aborted before its first token gets the reduced shape; after, its partial output."""
    for name, message in (("0.5.15", "Abort in waiting queue"), ("0.5.2", "Abort before prefill")):
        with ServerThread("rlvr-500", sglang_version=name, time_scale=200.0) as thread:
            trajectory = thread.context.store.trajectories[0]
            results: dict[str, object] = {}

            def send(key: str, rid: str) -> None:
                results[key] = request(thread.url, "/generate", _body(turn_input(trajectory, 0), rid=rid))

            queued = threading.Thread(target=send, args=("queued", "q-1"))
            queued.start()
            _wait_inflight(thread, "q-1")
            assert request(thread.url, "/abort_request", {"rid": "q-"}).status == 200
            queued.join(10)
            item = results["queued"].json()  # type: ignore[attr-defined]
            assert item["meta_info"]["finish_reason"] == ({"type": "abort", "message": message})
            assert item["meta_info"]["completion_tokens"] == 0
            if name == "0.5.2":
                assert list(item) == ["text", "meta_info"] and "output_token_logprobs" not in item["meta_info"]
            else:
                assert item["output_ids"] == [] and item["meta_info"]["output_token_logprobs"] == []
                assert "prompt_tokens" not in item["meta_info"]
    with ServerThread("rlvr-500", time_scale=5.0) as thread:
        trajectory = thread.context.store.trajectories[0]
        results = {}
        running = threading.Thread(target=lambda: results.update(r=request(
            thread.url, "/generate", _body(turn_input(trajectory, 0), rid="r-1"))))
        running.start()
        _wait_inflight(thread, "r-1", prefilled=True)
        time.sleep(0.3)
        assert request(thread.url, "/abort_request", {"abort_all": True}).status == 200
        running.join(10)
        meta = results["r"].json()["meta_info"]  # type: ignore[attr-defined]
        assert meta["finish_reason"] == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        partial = [t[1] for t in meta["output_token_logprobs"]]
        assert 0 < len(partial) < len(trajectory.turns[0].output_ids)
        assert partial == list(trajectory.turns[0].output_ids[: len(partial)])
        generated = [r for r in thread.context.log.records if r.endpoint == "/generate"]
        assert [r.finish for r in generated] == ["abort"]


def _wait_inflight(thread: ServerThread, rid: str, prefilled: bool = False) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entry = thread.context.state.inflight.get(rid)
        if entry is not None and (entry.prefilled or not prefilled):
            return
        time.sleep(0.01)
    raise AssertionError(f"{rid} never got in flight")


def test_time_scale_replays_recorded_latency() -> None:
    """Lower bounds only: the answer never comes sooner than the scaled recording says."""
    scale = 0.5
    with ServerThread("rlvr-500", time_scale=scale) as thread:
        trajectory = min(thread.context.store.trajectories[:40], key=lambda t: t.turns[0].total)
        recorded = trajectory.turns[0]
        started = time.monotonic()
        reply = _send(thread, trajectory, _body(turn_input(trajectory, 0), stream=True))
        elapsed = time.monotonic() - started
        assert reply.status == 200 and elapsed >= recorded.total * scale * 0.95
        records = [r for r in thread.context.log.records if r.endpoint == "/generate"]
        assert records[0].latency_s >= recorded.total * scale * 0.95


def test_request_log_is_served_to_a_remote_harness(server: ServerThread) -> None:
    rows = request(server.url, "/bench/requests").json()
    assert rows and {"endpoint", "trajectory", "turn", "attempt", "status", "drift"} <= set(rows[0])
