"""`rollout-bench record`: trajectories rebuilt from traffic, every wire shape read, nothing secret or lost."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.capture import journal
from bench.capture.parse import StreamAssembler, parse_answer, parse_request
from bench.capture.serve_recorder import RecordingProxy
from bench.capture.tracker import KnownGroup, TrafficTracker, ids_key, key_ids
from bench.server import ServerThread
from bench.trace import open_trace, validate_trace
from tests.router_helpers import free_port
from tests.server_helpers import request, turn_input

BENCH = [sys.executable, "-m", "bench"]


# -- placing requests in trajectories -----------------------------------------------------------
def _out(ids: list[int]) -> bytes:
    return ids_key(ids)[1:]


def test_identical_prompts_form_a_group_and_later_turns_extend_their_own_member() -> None:
    tracker = TrafficTracker()
    first, second = tracker.place(ids_key([1, 2, 3])), tracker.place(ids_key([1, 2, 3]))
    assert (first.group, first.turn, first.kind) == (second.group, 0, "new")
    assert first.trajectory != second.trajectory and {first.member, second.member} == {0, 1}
    tracker.settle(first, _out([7, 8]), "stop")
    tracker.settle(second, _out([9]), "stop")
    turn = tracker.place(ids_key([1, 2, 3, 9, 4, 4]))  # extends the second member's answer, not the first's
    assert (turn.trajectory, turn.turn, turn.attempt, turn.kind) == (second.trajectory, 1, 0, "turn")
    assert key_ids(turn.append) == [4, 4]
    other = tracker.place(ids_key([5, 6]))
    assert other.group != first.group and other.turn == 0


def test_a_resubmission_after_a_failure_is_the_same_turns_next_attempt() -> None:
    tracker = TrafficTracker()
    first = tracker.place(ids_key([1, 2]))
    tracker.settle(first, b"", "error")
    retry = tracker.place(ids_key([1, 2]))
    assert (retry.trajectory, retry.turn, retry.attempt, retry.kind) == (first.trajectory, 0, 1, "retry")
    tracker.settle(retry, _out([3]), "stop")
    later = tracker.place(ids_key([1, 2, 3, 4]))
    tracker.settle(later, _out([5]), "abort")
    again = tracker.place(ids_key([1, 2, 3, 4]))  # the aborted turn 1, resent as it was
    assert (again.trajectory, again.turn, again.attempt) == (first.trajectory, 1, 1)
    assert key_ids(again.append) == [4]
    tracker.settle(again, _out([5]), "abort")
    resumed = tracker.place(ids_key([1, 2, 3, 4, 5]))  # ... or resumed after its partial output: a next turn
    assert resumed.turn == 2 and resumed.trajectory == first.trajectory
    # a repeat of a prompt whose member succeeded is a new member, not an attempt
    assert tracker.place(ids_key([1, 2])).trajectory != first.trajectory


def test_trajectory_ids_come_from_the_prompt_or_from_a_trace() -> None:
    assert TrafficTracker().place(ids_key([1, 2])).trajectory == TrafficTracker().place(ids_key([1, 2])).trajectory
    known = {ids_key([1, 2]): KnownGroup("g7", ("g7-a", "g7-b"), (14, 15))}
    tracker = TrafficTracker(known)
    placed = [tracker.place(ids_key([1, 2])) for _ in range(3)]
    assert [(p.trajectory, p.index, p.known) for p in placed] == [("g7-a", 14, True), ("g7-b", 15, True),
                                                                  ("g7-2", 16, False)]


# -- reading the wire ------------------------------------------------------------------------------
def _stream(request_body: dict[str, Any], events: list[bytes]) -> Any:
    captured = parse_request("/generate", json.dumps(request_body).encode())
    assembler = StreamAssembler(captured, 0.0)
    for when, event in enumerate(events, start=1):
        assembler.feed(event, float(when))
    return assembler.answers()


def _event(ids: list[int], count: int, finish: Any = None) -> bytes:
    meta = {"id": "r", "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": count,
            "output_token_logprobs": [[-0.5, i, None] for i in ids], "cached_tokens": 0, "weight_version": "v2"}
    return b"data: " + json.dumps({"text": "", "output_ids": ids, "meta_info": meta}).encode() + b"\n\n"


def test_native_streams_cumulative_incremental_and_the_abort_chunk_with_only_the_last_id() -> None:
    body = {"input_ids": [1, 2, 3], "stream": True, "return_logprob": True}
    cumulative = _stream(body, [_event([5], 1), _event([5, 6], 2), _event([5, 6, 7], 3, {"type": "length"}),
                                b"data: [DONE]\n\n"])
    incremental = _stream(body, [_event([5], 1), _event([6], 2), _event([7], 3, {"type": "length"})])
    aborted = _stream(body, [_event([5], 1), _event([5, 6], 2), _event([6], 2, {"type": "abort"})])
    for answer in (cumulative[0], incremental[0]):
        assert (answer.output_ids, answer.logprobs, answer.weight_version) == ([5, 6, 7], [-0.5] * 3, "v2")
        assert (answer.ttft, answer.total) == (1.0, 3.0 if answer is incremental[0] else 4.0)
    assert aborted[0].output_ids == [5, 6] and aborted[0].finish_reason == {"type": "abort"}
    cut = _stream(body, [_event([5], 1)])  # no finish: the stream broke off
    assert cut[0].outcome == "abort" and cut[0].output_ids == [5]
    in_band = _stream(body, [b'data: {"error":{"message":"too long","code":400}}\n\n', b"data: [DONE]\n\n"])
    assert in_band[0].error is not None and (in_band[0].error.status, in_band[0].error.message) == (400, "too long")


def test_openai_bodies_with_token_ids_and_error_bodies() -> None:
    captured = parse_request("/v1/completions", json.dumps({"prompt": [1, 2], "n": 2, "logprobs": 1,
                                                              "return_token_ids": True}).encode())
    assert len(captured.inputs) == 2 and captured.inputs[0].input_ids == [1, 2]
    body = {"choices": [{"index": i, "text": "ab", "token_ids": [4, 5], "prompt_token_ids": [1, 2],
                         "finish_reason": "stop", "stop_reason": None,
                         "logprobs": {"token_logprobs": [-0.1, -0.2], "tokens": ["a", "b"]}} for i in (1, 0)],
            "usage": {"prompt_tokens": 2}}
    answers = parse_answer(captured, 200, json.dumps(body).encode(), 0.5)
    assert [a.output_ids for a in answers] == [[4, 5], [4, 5]] and answers[0].logprobs == [-0.1, -0.2]
    assert answers[0].finish_reason == {"type": "stop", "matched": 5}
    router_503 = (b'{"error":{"type":"Service Unavailable","code":"no_available_workers",'
                  b'"message":"No available workers (all circuits open or unhealthy)"}}')
    failed = parse_answer(captured, 503, router_503, 0.1)
    assert failed[0].outcome == "error" and failed[0].error.message.startswith("No available workers")
    assert parse_answer(captured, 500, b"Internal Server Error", 0.1)[0].error.message == "Internal Server Error"
    assert "2 generations" in parse_answer(captured, 200, b'{"choices":[]}', 0.1)[0].error.message


# -- the recorder in front of the mock ----------------------------------------------------------
async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with session.post(url + "/generate", json=body, headers=headers) as reply:
        return reply.status, await reply.read()


def test_recorder_forwards_unchanged_keeps_no_secret_and_redacts_text(tmp_path: Path) -> None:
    secret = "sk-rollout-bench-secret-1234"

    async def scenario(mock: ServerThread, out: Path, redact: bool) -> dict[str, Any]:
        proxy = RecordingProxy(mock.url, out, redact_text=redact)
        url = await proxy.start()
        store = mock.context.store
        trajectory = next(t for t in store.trajectories if len(t.turns) >= 2)
        seen: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            auth = {"Authorization": f"Bearer {secret}", "X-API-Key": secret}
            for turn in range(2):
                body = {"input_ids": turn_input(trajectory, turn), "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 4096}, "stream": turn == 1}
                seen[f"turn{turn}"] = await _post(session, url, body, auth)
            too_long = {"input_ids": [5] * (store.header.context_length + 1), "sampling_params": {}}
            seen["refused"] = await _post(session, url, too_long)
            async with session.get(url + "/get_model_info") as reply:
                seen["model_info"] = (reply.status, await reply.read())
        async with aiohttp.ClientSession() as session, session.get(mock.url + "/get_model_info") as direct:
            seen["model_info_direct"] = (direct.status, await direct.read())
        seen["trajectory"] = trajectory
        seen["path"] = await proxy.stop()
        return seen

    with ServerThread("agentic-500") as mock:
        seen = asyncio.run(scenario(mock, tmp_path / "plain.jsonl", False))
    assert seen["turn0"][0] == 200 and seen["turn1"][0] == 200 and seen["turn1"][1].endswith(b"data: [DONE]\n\n")
    assert seen["refused"][0] == 400 and seen["model_info"] == seen["model_info_direct"]
    text = seen["path"].read_text()
    assert secret not in text and "Bearer" not in text
    assert [p.message for p in validate_trace(seen["path"])] == []
    with open_trace(seen["path"]) as reader:
        recorded = list(reader)
    original = seen["trajectory"]
    multi = next(t for t in recorded if len(t.turns) == 2)
    assert multi.prompt.ids == turn_input(original, 0)
    assert [t.response.output_ids for t in multi.turns] == [list(t.output_ids) for t in original.turns[:2]]
    assert multi.turns[0].tool_outputs and multi.turns[0].tool_outputs[0].text  # read back from turn 1's input
    refused = next(t for t in recorded if t.turns[0].response.error is not None)
    assert refused.turns[0].response.error.status == 400 and "context length" in refused.turns[0].response.error.message
    body = json.loads(refused.metadata["recording"]["errors"][0]["body"])  # the error body, as the server sent it
    assert body["error"]["message"] == refused.turns[0].response.error.message

    with ServerThread("agentic-500") as mock:
        redacted = asyncio.run(scenario(mock, tmp_path / "redacted.jsonl", True))
    assert [p.message for p in validate_trace(redacted["path"])] == []
    with open_trace(redacted["path"]) as reader:
        assert reader.header.metadata["text_redacted"] is True
        hidden = list(reader)
    some_text = multi.turns[0].response.text[:30]
    assert some_text and some_text not in redacted["path"].read_text()
    assert all(t.prompt.text == "" and all(turn.response.text == "" for turn in t.turns) for t in hidden)
    assert sorted(t.turns[0].response.output_ids for t in hidden) == sorted(t.turns[0].response.output_ids
                                                                             for t in recorded)


def test_openai_routes_are_recorded_with_their_token_ids_streamed_or_not(tmp_path: Path) -> None:
    async def scenario(mock: ServerThread) -> tuple[list[Any], Path]:
        proxy = RecordingProxy(mock.url, tmp_path / "openai.jsonl")
        url = await proxy.start()
        trajectory = mock.context.store.trajectories[0]
        prompt = turn_input(trajectory, 0)
        seen = []
        async with aiohttp.ClientSession() as session:
            for stream in (False, True):
                body = {"model": mock.context.config.model_name, "prompt": prompt, "max_tokens": 1024, "logprobs": 1,
                        "return_token_ids": True, "stream": stream}
                async with session.post(url + "/v1/completions", json=body) as reply:
                    assert reply.status == 200
                    raw = await reply.read()
                if stream:
                    chunks = [json.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]
                    ids = [i for c in chunks for choice in c["choices"] for i in (choice.get("token_ids") or [])]
                    logprobs = [v for c in chunks for choice in c["choices"]
                                for v in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
                else:
                    choice = json.loads(raw)["choices"][0]
                    ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
                seen.append((ids, logprobs))
            chat = {"model": mock.context.config.model_name, "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 64, "logprobs": True, "return_token_ids": True}
            async with session.post(url + "/v1/chat/completions", json=chat) as reply:
                assert reply.status == 200
                answer = await reply.json()
            seen.append((answer["choices"][0]["token_ids"], [e["logprob"] for e in
                                                             answer["choices"][0]["logprobs"]["content"]]))
            async with session.post(url + "/v1/chat/completions", json=chat | {"stream": True}) as reply:
                chunks = [json.loads(line[6:]) for line in (await reply.read()).split(b"\n\n")
                          if line.startswith(b"data: {")]
            seen.append(([i for c in chunks for choice in c["choices"] for i in (choice.get("token_ids") or [])],
                         [e["logprob"] for c in chunks for choice in c["choices"]
                          for e in ((choice.get("logprobs") or {}).get("content") or [])]))
        return seen, await proxy.stop()

    with ServerThread("rlvr-500") as mock:
        seen, path = asyncio.run(scenario(mock))
    assert [p.message for p in validate_trace(path)] == []
    with open_trace(path) as reader:
        recorded = list(reader)
    completions = [t for t in recorded if t.turns[0].request.endpoint == "/v1/completions"]
    assert len(completions) == 2 and {t.group_id for t in completions} == {completions[0].group_id}
    assert sorted((t.turns[0].response.output_ids, t.turns[0].response.logprobs) for t in completions) == \
        sorted((ids, logprobs) for ids, logprobs in seen[:2])
    chats = [t for t in recorded if t.turns[0].request.endpoint == "/v1/chat/completions"]
    assert len(chats) == 2 and all(t.prompt.messages == [{"role": "user", "content": "hello"}] for t in chats)
    assert all(t.prompt.ids and t.turns[0].request.input_ids_append == [] for t in chats)  # replayable: in ids
    assert sorted((t.turns[0].response.output_ids, t.turns[0].response.logprobs) for t in chats) == sorted(seen[2:])
    assert seen[3][0], "the streamed chat carried token ids"  # streamed or not, the ids are kept


def test_compaction_joins_fragments_and_keeps_the_file_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "COMPACT_MIN_BYTES", 2000)
    out = tmp_path / "small.jsonl.gz"

    async def scenario(mock: ServerThread) -> Any:
        proxy = RecordingProxy(mock.url, out)
        url = await proxy.start()
        store = mock.context.store
        async with aiohttp.ClientSession() as session:
            for trajectory in store.trajectories[:6]:
                for turn in range(min(3, len(trajectory.turns))):
                    body = {"input_ids": turn_input(trajectory, turn), "return_logprob": True,
                            "sampling_params": {"max_new_tokens": 4096}}
                    assert (await _post(session, url, body))[0] == 200
                    assert [p.message for p in validate_trace(out)] == []
        compactions = proxy.recorder.journal.compactions
        await proxy.stop()
        return compactions

    with ServerThread("agentic-500") as mock:
        compactions = asyncio.run(scenario(mock))
    assert compactions >= 2
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # compressed at the clean end
    with open_trace(out) as reader:
        recorded = list(reader)
    assert all("/" not in t.id for t in recorded)  # no fragment left
    assert sum(len(t.turns) for t in recorded) == sum(min(3, len(t.turns)) for t in mock.context.store.trajectories[:6])


# -- the command, killed --------------------------------------------------------------------------
def _wait_listening(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            request(url, "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"recorder not listening after 30 s: {log.read_text()}")


def _record_command(upstream: str, out: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`rollout-bench record` as a user runs it, on a free port, listening when this returns."""
    port = free_port()
    with open(log, "wb") as sink:
        recorder = subprocess.Popen([*BENCH, "record", "--upstream", upstream, "--out", str(out), "--port", str(port)],
                                    stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_listening(url, recorder, log)
    return recorder, url


def test_a_recorder_killed_mid_run_leaves_a_valid_trace_with_every_completed_exchange(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print(f"kill point seed: {seed}")
    rng = random.Random(seed)
    out, log = tmp_path / "killed.jsonl", tmp_path / "record.log"
    with ServerThread("agentic-500") as mock:
        recorder, url = _record_command(mock.url, out, log)
        try:
            kill_after = rng.randrange(5, 40)
            completed = 0

            async def traffic() -> int:
                store = mock.context.store
                async with aiohttp.ClientSession() as session:
                    async def one(trajectory: Any) -> None:
                        nonlocal completed
                        for turn in range(len(trajectory.turns)):
                            body = {"input_ids": turn_input(trajectory, turn), "return_logprob": True,
                                    "sampling_params": {"max_new_tokens": 4096}, "stream": turn % 2 == 1}
                            status, _ = await _post(session, url, body)
                            assert status == 200
                            completed += 1
                            if completed == kill_after:
                                os.kill(recorder.pid, signal.SIGKILL)
                    ended = await asyncio.gather(*(one(t) for t in store.trajectories[:16]), return_exceptions=True)
                # only the kill may end a client: a refused connection or a dropped one, never a wrong status
                assert all(r is None or isinstance(r, (aiohttp.ClientError, OSError)) for r in ended), ended
                return completed

            asyncio.run(traffic())
        finally:
            recorder.kill()
            recorder.wait(timeout=10)
    assert recorder.returncode == -signal.SIGKILL
    assert [p.message for p in validate_trace(out)] == []
    with open_trace(out) as reader:
        exchanges = sum(len(t.turns) for t in reader)
    assert exchanges >= kill_after, (seed, exchanges, kill_after)
    assert not list(tmp_path.glob(".*.partial"))
    # what it holds replays: each fragment stands alone (its prompt the turn's whole input)
    from bench.orchestration.runner import RunConfig, run_blocking

    result = run_blocking(RunConfig(trace=str(out), target="ref-gather:fixed", plan=None, isolation="inline"))
    served = [r for r in result.requests if r.endpoint == "/generate"]
    assert served and all(r.trajectory is not None and r.drift is None for r in served), seed


def test_record_refuses_an_unreachable_upstream_and_an_existing_file_by_name(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([*BENCH, "record", "--upstream", dead, "--out", str(tmp_path / "x.jsonl")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "does not answer" in result.stderr and dead in result.stderr
    existing = tmp_path / "taken.jsonl"
    existing.write_text("keep me")
    with ServerThread("rlvr-500") as mock:
        result = subprocess.run([*BENCH, "record", "--upstream", mock.url, "--out", str(existing)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--force" in result.stderr and existing.read_text() == "keep me"


def test_a_clean_stop_joins_the_recording(tmp_path: Path) -> None:
    out, log = tmp_path / "clean.jsonl", tmp_path / "record.log"
    with ServerThread("rlvr-500") as mock:
        recorder, url = _record_command(mock.url, out, log)
        try:
            for trajectory in mock.context.store.trajectories[:4]:
                reply = request(url, "/generate", {"input_ids": turn_input(trajectory, 0), "return_logprob": True})
                assert reply.status == 200
            recorder.send_signal(signal.SIGTERM)
            assert recorder.wait(timeout=30) == 0, log.read_text()
        finally:
            if recorder.poll() is None:
                recorder.kill()
    assert "recorded 4 exchanges in 4 trajectories" in log.read_text()
    with open_trace(out) as reader:
        assert reader.header.source.kind == "recorded" and reader.header.source.details["exchanges"] == 4
        assert len(list(reader)) == 4
    inspected = subprocess.run([*BENCH, "inspect", str(out), "--out", str(tmp_path / "inspect")], capture_output=True,
                               text=True, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    summary = (tmp_path / "inspect" / "summary.json").read_text()
    outcomes = json.loads(summary)["outcomes"]
    assert "NaN" not in summary and sum(outcomes.values()) == 4 and all(k.startswith("last turn ") for k in outcomes)


def test_an_idle_recording_is_joined_on_a_timer_and_a_gz_file_is_gzip_throughout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.capture import serve_recorder

    monkeypatch.setattr(journal, "COMPACT_EVERY_S", 0.2)
    monkeypatch.setattr(serve_recorder, "COMPACT_EVERY_S", 0.2)
    out = tmp_path / "live.jsonl.gz"

    async def scenario(mock: ServerThread) -> tuple[list[Any], list[Any]]:
        proxy = RecordingProxy(mock.url, out)
        url = await proxy.start()
        trajectory = next(t for t in mock.context.store.trajectories if len(t.turns) >= 3)
        async with aiohttp.ClientSession() as session:
            for turn in range(3):
                body = {"input_ids": turn_input(trajectory, turn), "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 4096}}
                assert (await _post(session, url, body))[0] == 200
        assert out.read_bytes()[:2] == b"\x1f\x8b"
        with open_trace(out) as reader:
            before = list(reader)  # fragments appended as gzip members: readable as they are
        await asyncio.sleep(1.0)  # no traffic: the timer joins them
        with open_trace(out) as reader:
            after = list(reader)
        await proxy.stop()
        return before, after

    with ServerThread("agentic-500") as mock:
        before, after = asyncio.run(scenario(mock))
    assert sum(len(t.turns) for t in before) == 3
    assert len(after) == 1 and len(after[0].turns) == 3 and "/" not in after[0].id


def test_credentials_in_the_upstream_url_are_used_never_written_and_a_taken_port_leaves_no_file(
        tmp_path: Path) -> None:
    async def scenario(mock: ServerThread) -> tuple[int, str, str]:
        port = mock.url.rsplit(":", 1)[1]
        proxy = RecordingProxy(f"http://user:s3cret-pw@127.0.0.1:{port}", tmp_path / "auth.jsonl")
        url = await proxy.start()
        async with aiohttp.ClientSession() as session:
            status, _ = await _post(session, url, {"input_ids": turn_input(mock.context.store.trajectories[0], 0)},
                                    {"Authorization": "Bearer client-token"})
        path = await proxy.stop()
        taken = RecordingProxy(mock.url, tmp_path / "never.jsonl", port=int(port))  # the mock's own port
        with pytest.raises(Exception, match="cannot listen"):
            await taken.start()
        return status, path.read_text(), url

    with ServerThread("rlvr-500") as mock:
        status, text, _ = asyncio.run(scenario(mock))
    assert status == 200 and "s3cret-pw" not in text and "user:" not in text
    assert not (tmp_path / "never.jsonl").exists()
    result = subprocess.run([*BENCH, "record", "--upstream", "127.0.0.1:30000", "--out", str(tmp_path / "y.jsonl")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "http://" in result.stderr and not (tmp_path / "y.jsonl").exists()


# -- an upstream that misbehaves ------------------------------------------------------------------
def _native(ids: list[int], finish: Any) -> dict[str, Any]:
    meta = {"id": "r", "finish_reason": finish, "prompt_tokens": 2, "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.25, i, None] for i in ids], "cached_tokens": 0}
    return {"text": "ab", "output_ids": ids, "meta_info": meta}


async def _odd_engine(request: Any) -> Any:
    """What each test prompt's first id asks for: a body cut short, gzip, no finish reason, a huge id, CRLF SSE,
    or Basic auth required."""
    from aiohttp import web

    body = await request.json()
    kind = body["input_ids"][0]
    if kind == 1:  # says 200 bytes, sends 20, hangs up
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "200"})
        await response.prepare(request)
        await response.write(b'{"text":"cut short..')
        request.transport.close()
        return response
    if kind == 2:
        return web.Response(body=__import__("gzip").compress(json.dumps(_native([5, 6], {"type": "stop",
                            "matched": 6})).encode()), headers={"Content-Encoding": "gzip",
                                                                "Content-Type": "application/json"})
    if kind == 3:
        return web.json_response(_native([5, 6], None))
    if kind == 4:
        return web.json_response(_native([2**31 + 5], {"type": "length", "length": 1}))
    if kind == 5:
        events = [_native([5], None), _native([5, 6], {"type": "stop", "matched": 6})]
        data = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"
        return web.Response(body=data, content_type="text/event-stream")
    if kind == 6:
        if request.headers.get("Authorization") != "Basic dXNlcjpzM2NyZXQ=":  # user:s3cret
            return web.Response(status=401, text="who are you")
        return web.json_response(_native([5, 6], {"type": "stop", "matched": 6}))
    return web.json_response(_native([5, 6], {"type": "stop", "matched": 6}))


def test_an_odd_upstream_answer_is_forwarded_and_recorded_or_noted_never_a_500(tmp_path: Path) -> None:
    from aiohttp import web

    async def scenario() -> dict[str, Any]:
        app = web.Application()
        app.router.add_post("/generate", _odd_engine)
        async def health(request: Any) -> Any:
            return web.Response()

        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        proxy = RecordingProxy(f"http://user:s3cret@127.0.0.1:{port}", tmp_path / "odd.jsonl")
        url = await proxy.start()
        seen: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            for name, kind, stream in (("cut", 1, False), ("cut-again", 1, False), ("gzip", 2, False),
                                       ("no-finish", 3, False), ("huge-id", 4, False), ("crlf", 5, True),
                                       ("auth", 6, False)):
                body = {"input_ids": [kind, 2**31 + 7 if kind == 4 else 9], "return_logprob": True, "stream": stream}
                async with session.post(url + "/generate", json=body) as reply:
                    seen[name] = (reply.status, await reply.read())
        seen["path"] = await proxy.stop()
        seen["stats"] = proxy.recorder.stats
        await runner.cleanup()
        return seen

    seen = asyncio.run(scenario())
    assert seen["cut"][0] == 502 and b"broke off" in seen["cut"][1]
    assert seen["gzip"][0] == 200 and json.loads(seen["gzip"][1])["output_ids"] == [5, 6]  # decompressed by the client
    assert all(seen[name][0] == 200 for name in ("no-finish", "huge-id", "crlf", "auth"))
    assert seen["stats"].unrecordable == 1  # the id past any vocabulary: forwarded, noted, not recorded
    assert [p.message for p in validate_trace(seen["path"])] == []
    with open_trace(seen["path"]) as reader:
        assert "not recorded" in reader.header.source.details["notes"][0]
        recorded = {t.prompt.ids[0]: t for t in reader}
    cut = recorded[1]
    assert len(cut.turns) == 1 and cut.turns[0].response.error.status == 502  # the retry is the same turn's attempt
    assert cut.metadata["recording"]["attempts"][0]["status"] == 502
    assert recorded[2].turns[0].response.output_ids == [5, 6]  # parsed from a decompressed copy
    assert recorded[3].turns[0].response.finish_reason["type"] == "abort"
    assert 4 not in recorded
    assert recorded[5].turns[0].response.output_ids == [5, 6]  # CRLF-framed events read
    assert recorded[6].turns[0].response.error is None  # the URL's credentials reached the engine


def test_members_whose_next_inputs_coincide_each_get_their_own_turn() -> None:
    """Greedy decoding: two members answer alike and their next inputs are identical; neither is the other's retry."""
    tracker = TrafficTracker()
    first, second = tracker.place(ids_key([1, 2])), tracker.place(ids_key([1, 2]))
    tracker.settle(first, _out([7]), "stop")
    tracker.settle(second, _out([7]), "stop")
    a = tracker.place(ids_key([1, 2, 7, 3]))
    tracker.settle(a, _out([8]), "stop")
    b = tracker.place(ids_key([1, 2, 7, 3]))
    assert (a.turn, b.turn, a.attempt, b.attempt) == (1, 1, 0, 0) and a.trajectory != b.trajectory
    tracker.settle(b, _out([8]), "stop")
    again = tracker.place(ids_key([1, 2, 7, 3]))  # sent a third time, after both succeeded: a resubmission
    assert again.kind == "retry" and again.turn == 1


def test_a_null_completions_logprob_stays_null() -> None:
    captured = parse_request("/v1/completions", json.dumps({"prompt": [1, 2], "logprobs": 1}).encode())
    body = {"choices": [{"index": 0, "text": "ab", "token_ids": [4, 5], "finish_reason": "length",
                         "logprobs": {"token_logprobs": [None, -0.2], "tokens": ["a", "b"]}}]}
    assert parse_answer(captured, 200, json.dumps(body).encode(), 0.1)[0].logprobs == [None, -0.2]
