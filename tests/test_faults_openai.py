"""Faults on the OpenAI-compatible routes, forced with `X-Bench-Fault`, seen as bytes and through the real SDK.

Each test takes a fresh trajectory, so the forced fault's event is attempt 1 of turn 0 of it.
The bytes are checked against WIRE.md (3.1-3.4, 4.4, 6); the `openai` SDK (2.36.0) shows what a
client such as verifiers or open-instruct gets: an exception class, or a silently odd answer.
"""

from __future__ import annotations

import functools
import http.client
import json
import math
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import openai
import pytest

import faults.catalogue  # noqa: F401  (registers every fault type)
from bench.server import ServerThread
from bench.trace import Trajectory, open_trace
from bench.trace.shipped import shipped_trace
from faults import FAULTS, plan_from_specs
from faults.hooks import POISON_MARKER
from tests.server_helpers import request

CHAT, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/inference/v1/generate"
LIMIT = 8  # tokens asked for: every rlvr-500 answer is longer, so an unfaulted answer ends with "length"
NO_WORKERS = "No available workers (all circuits open or unhealthy)"
ROUTER_503 = (b'{"error":{"type":"Service Unavailable","code":"no_available_workers","message":"'
              + NO_WORKERS.encode() + b'"}}')

with open_trace(shipped_trace("rlvr-500")) as _reader:
    _POOL = iter([t for _, t in zip(range(400), _reader)])


def fresh() -> Trajectory:
    """A trajectory no test has requested yet (its turn 0 is then attempt 1)."""
    return next(_POOL)


@contextmanager
def fires(server: ServerThread, fault: str, trajectory: Trajectory, endpoint: str = CHAT,
          attempts: tuple[int, ...] = (1,)) -> Iterator[None]:
    """Assert the block logs exactly one event of the forced `fault` per attempt, on turn 0 of `trajectory`."""
    before = len(server.context.faults.log.events)
    yield
    events = server.context.faults.log.events[before:]
    assert [(e.rule, e.fault, e.trajectory, e.group, e.turn, e.attempt, e.endpoint) for e in events] == [
        (f"header:{fault}#0", fault, trajectory.id, trajectory.group_id, 0, attempt, endpoint) for attempt in attempts]


@functools.lru_cache(maxsize=None)
def client(url: str, timeout: float = 30) -> openai.OpenAI:
    """One SDK client per server (building one costs ~0.1 s); no retries, so each call is one attempt."""
    return openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=timeout)


def headers(trajectory: Trajectory, fault: str) -> dict[str, str]:
    return {"X-Bench-Fault": fault, "X-Bench-Trajectory": trajectory.id}


def chat(server: ServerThread, trajectory: Trajectory, fault: str, *, stream: bool = False, timeout: float = 30,
         **extra: Any) -> Any:
    """verifiers' chat call (logprobs and vLLM token ids asked for) with `fault` forced."""
    return client(server.url, timeout).chat.completions.create(
        model="mock-model", messages=trajectory.prompt.messages, logprobs=True, max_completion_tokens=LIMIT,
        stream=stream, extra_body={"return_token_ids": True, **extra}, extra_headers=headers(trajectory, fault))


def complete(server: ServerThread, trajectory: Trajectory, fault: str, *, stream: bool = False) -> Any:
    """open-instruct's completions call: token-id prompt, `return_token_ids`."""
    return client(server.url).completions.create(
        model="mock-model", prompt=trajectory.prompt.ids, logprobs=1, max_tokens=LIMIT, stream=stream,
        extra_body={"return_token_ids": True}, extra_headers=headers(trajectory, fault))


@dataclass
class Raw:
    status: int | None  # None: the connection dropped before a status line
    headers: dict[str, str]
    body: bytes
    complete: bool  # False: the connection dropped before the promised body ended

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[bytes]:
        """SSE payloads; the last one may be `[DONE]` or a torn event."""
        assert all(p.startswith(b"data: ") for p in self.body.split(b"\n\n")[:-1]), self.body
        return [p[len(b"data: "):] for p in self.body.split(b"\n\n") if p]


def raw(server: ServerThread, path: str, body: dict[str, Any], fault: str, trajectory: Trajectory) -> Raw:
    """POST with plain http.client: every byte the server sent, even from a dropped connection."""
    url = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body),
                           {"Content-Type": "application/json", **headers(trajectory, fault)})
        try:
            response = connection.getresponse()
        except ConnectionError:  # includes http.client.RemoteDisconnected
            return Raw(None, {}, b"", False)
        got = {k.lower(): v for k, v in response.getheaders()}
        try:
            return Raw(response.status, got, response.read(), True)
        except http.client.IncompleteRead as torn:
            return Raw(response.status, got, torn.partial, False)
    finally:
        connection.close()


def chat_body(trajectory: Trajectory, **extra: Any) -> dict[str, Any]:
    return {"messages": trajectory.prompt.messages, "logprobs": True, "max_completion_tokens": LIMIT,
            "return_token_ids": True, **extra}


def recorded(trajectory: Trajectory) -> Any:
    return trajectory.turns[0].response


def server_faults(api: str) -> set[str]:
    return {name for name, cls in FAULTS.items() if api in cls.apis and cls.server_side}


# -- the header ----------------------------------------------------------------------------------
def test_every_openai_fault_is_covered_here() -> None:
    """A new fault type for the OpenAI routes must get a test in this file."""
    source = open(__file__, encoding="utf-8").read()
    applicable = server_faults("openai")
    assert len(applicable) >= 20
    missing = [name for name in sorted(applicable) if f'"{name}' not in source]
    assert missing == []
    assert "text_without_ids" in server_faults("openai") - server_faults("native")


def test_unknown_fault_is_a_400_naming_the_valid_ones(vllm: ServerThread, sglang: ServerThread) -> None:
    trajectory = fresh()
    before = len(vllm.context.faults.log.events)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(vllm, trajectory, "nope")
    assert caught.value.status_code == 400
    valid = "unknown fault 'nope'; valid faults: abort, abort_all_on_weight_update, connection_reset,"
    assert valid in str(caught.value)
    assert "text_without_ids" in caught.value.body["message"]
    assert len(vllm.context.faults.log.events) == before
    assert vllm.context.log.records[-1].status == 400 and vllm.context.log.records[-1].trajectory is None
    flat = raw(sglang, CHAT, chat_body(trajectory), "http_error:stauts=500", trajectory)
    assert flat.status == 400 and flat.json()["object"] == "error"
    assert "http_error: unknown parameter 'stauts'; valid parameters: status, retry_after" in flat.json()["message"]


def test_a_client_side_fault_cannot_be_forced(vllm: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError, match="stale_retry acts in the target adapter"):
        chat(vllm, fresh(), "stale_retry")


def test_a_plan_reaches_the_openai_routes_without_a_header(vllm: ServerThread) -> None:
    trajectory = fresh()
    old = vllm.context.faults.swap(plan_from_specs([f"missing_logprobs:trajectories={trajectory.id}"], seed=3))
    try:
        resp = client(vllm.url).chat.completions.create(
            model="m", messages=trajectory.prompt.messages, logprobs=True, max_completion_tokens=LIMIT,
            extra_headers={"X-Bench-Trajectory": trajectory.id})
        other = fresh()
        unfaulted = client(vllm.url).chat.completions.create(
            model="m", messages=other.prompt.messages, logprobs=True, max_completion_tokens=LIMIT,
            extra_headers={"X-Bench-Trajectory": other.id})
    finally:
        vllm.context.faults.swap(old)
    assert resp.choices[0].logprobs is None and len(unfaulted.choices[0].logprobs.content) == LIMIT
    event = vllm.context.faults.log.events[-1]
    assert (event.rule, event.trajectory, event.attempt) == ("missing_logprobs#0", trajectory.id, 1)


def test_every_choice_is_an_attempt_the_faults_decide_about(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "missing_logprobs", trajectory, attempts=(1, 2)):
        resp = chat(vllm, trajectory, "missing_logprobs", n=2)
    assert [c.logprobs for c in resp.choices] == [None, None]
    assert all(len(c.token_ids) == LIMIT for c in resp.choices)


# -- HTTP replacements ---------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["router_no_workers", "outage"])
def test_router_503_byte_for_byte(vllm: ServerThread, fault: str) -> None:
    trajectory = fresh()
    with fires(vllm, fault, trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), fault, trajectory)
    assert reply.status == 503 and reply.body == ROUTER_503
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-smg-error-code"] == "no_available_workers"
    assert "retry-after" not in reply.headers


@pytest.mark.parametrize("stream", [False, True])
def test_router_503_is_an_internal_server_error_before_any_stream(vllm: ServerThread, stream: bool) -> None:
    trajectory = fresh()
    with fires(vllm, "router_no_workers", trajectory), pytest.raises(openai.InternalServerError) as caught:
        chat(vllm, trajectory, "router_no_workers", stream=stream)
    assert caught.value.status_code == 503
    assert caught.value.body == {"type": "Service Unavailable", "code": "no_available_workers", "message": NO_WORKERS}
    assert NO_WORKERS in str(caught.value)
    record = vllm.context.log.records[-1]
    assert (record.trajectory, record.status, record.error) == (trajectory.id, 503, "fault replacement")


def test_router_0_2_answers_plain_text(sglang: ServerThread) -> None:
    trajectory = fresh()
    with fires(sglang, "router_no_workers", trajectory), pytest.raises(openai.InternalServerError) as caught:
        chat(sglang, trajectory, "router_no_workers:router_version=0.2")
    assert caught.value.response.headers["content-type"].startswith("text/plain")
    assert caught.value.body == NO_WORKERS and caught.value.message == NO_WORKERS


def test_a_retry_after_a_503_is_attempt_2(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "router_no_workers", trajectory, attempts=(1, 2)):
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                chat(vllm, trajectory, "router_no_workers")
    assert [r.attempt for r in vllm.context.log.records[-2:]] == [1, 2]


def test_router_429_is_empty_and_a_rate_limit_error(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "http_error", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "http_error:status=429", trajectory)
    assert reply.status == 429 and reply.body == b"" and "content-type" not in reply.headers
    again = fresh()
    with fires(vllm, "http_error", again), pytest.raises(openai.RateLimitError) as caught:
        chat(vllm, again, "http_error:status=429,retry_after=2")
    assert caught.value.status_code == 429 and caught.value.response.headers["retry-after"] == "2"


@pytest.mark.parametrize("status, error", [(400, openai.BadRequestError), (404, openai.NotFoundError),
                                           (500, openai.InternalServerError)])
def test_http_errors_in_the_vllm_envelope(vllm: ServerThread, status: int, error: type[Exception]) -> None:
    trajectory = fresh()
    with fires(vllm, "http_error", trajectory), pytest.raises(error) as caught:
        chat(vllm, trajectory, f"http_error:status={status}")
    assert caught.value.status_code == status
    assert set(caught.value.body) == {"message", "type", "param", "code"} and caught.value.body["code"] == status


def test_http_errors_in_the_sglang_envelope(sglang: ServerThread) -> None:
    trajectory = fresh()
    reply = raw(sglang, CHAT, chat_body(trajectory), "http_error:status=500", trajectory)
    assert reply.status == 500
    assert list(reply.json()) == ["object", "message", "type", "param", "code"]
    assert reply.json()["type"] == "InternalServerError" and reply.json()["code"] == 500


def test_a_proxy_502_is_html(vllm: ServerThread) -> None:
    trajectory = fresh()
    with pytest.raises(openai.InternalServerError) as caught:
        chat(vllm, trajectory, "http_error:status=502", stream=True)
    assert caught.value.response.headers["content-type"].startswith("text/html")
    assert "<h1>502 Bad Gateway</h1>" in caught.value.message


# -- context length --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_refuses_a_claimed_context_before_streaming(vllm: ServerThread, stream: bool) -> None:
    trajectory = fresh()
    prompt = len(trajectory.prompt.ids)
    with fires(vllm, "context_length_error", trajectory), pytest.raises(openai.BadRequestError) as caught:
        chat(vllm, trajectory, "context_length_error", stream=stream)
    message = caught.value.body["message"]
    assert message == (f"This model's maximum context length is {prompt} tokens. However, you requested {LIMIT} "
                       f"output tokens and your prompt contains {prompt} input tokens, for a total of "
                       f"{prompt + LIMIT} tokens. Please reduce the length of the input prompt or the number of "
                       f"requested output tokens. (parameter=input_tokens, value={prompt})")
    assert "this model's maximum context length is" in message.lower()  # verifiers' OverlongPromptError test
    assert caught.value.body["param"] == "input_tokens"
    assert vllm.context.log.records[-1].status == 400


def test_context_length_parameter_is_the_claimed_limit(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "context_length_error", trajectory, endpoint=COMPLETIONS):
        with pytest.raises(openai.BadRequestError, match="maximum context length is 50 tokens"):
            complete(vllm, trajectory, "context_length_error:context_length=50")


def test_sglang_context_refusal_is_a_flat_400(sglang: ServerThread) -> None:
    trajectory = fresh()
    prompt = len(trajectory.prompt.ids)
    with fires(sglang, "context_length_error", trajectory), pytest.raises(openai.BadRequestError) as caught:
        chat(sglang, trajectory, "context_length_error")
    assert caught.value.body == {"object": "error", "message": f"The input ({prompt} tokens) is longer than the "
                                 f"model's context length ({prompt} tokens).", "type": "BadRequestError",
                                 "param": None, "code": 400}


def test_sglang_context_refusal_in_a_stream_is_in_band(sglang: ServerThread) -> None:
    trajectory = fresh()
    prompt = len(trajectory.prompt.ids)
    with fires(sglang, "context_length_error", trajectory):
        reply = raw(sglang, CHAT, chat_body(trajectory, stream=True), "context_length_error", trajectory)
    assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
    error, done = reply.events()
    assert done == b"[DONE]" and json.loads(error)["error"]["code"] == 400
    again = fresh()
    stream = chat(sglang, again, "context_length_error", stream=True)  # the 200 comes back fine...
    with pytest.raises(openai.APIError) as caught:  # ...and iterating raises, with no status class
        list(stream)
    assert not isinstance(caught.value, openai.APIStatusError)
    assert caught.value.message == (f"The input ({len(again.prompt.ids)} tokens) is longer than the model's context "
                                    f"length ({len(again.prompt.ids)} tokens).")


# -- broken bodies ---------------------------------------------------------------------------------
def test_malformed_json_is_a_json_decode_error(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "malformed_json", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "malformed_json", trajectory)
    assert reply.status == 200 and reply.headers["content-type"] == "application/json" and reply.complete
    assert reply.body.startswith(b'{"id":"chatcmpl-')
    with pytest.raises(json.JSONDecodeError):
        reply.json()
    with pytest.raises(json.JSONDecodeError):  # not an openai.APIError: nothing retries it
        chat(vllm, fresh(), "malformed_json")


def test_malformed_json_breaks_one_stream_event(vllm: ServerThread) -> None:
    trajectory = fresh()
    reply = raw(vllm, CHAT, chat_body(trajectory, stream=True), "malformed_json", trajectory)
    *events, done = reply.events()
    assert done == b"[DONE]" and len(events) == 1 + LIMIT
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[0])
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[1:])
    with pytest.raises(json.JSONDecodeError):
        list(chat(vllm, fresh(), "malformed_json", stream=True))


@pytest.mark.parametrize("content_type", ["application/octet-stream", "text/plain"])
def test_valid_json_under_another_content_type_still_parses(vllm: ServerThread, content_type: str) -> None:
    trajectory = fresh()
    spec = f"wrong_content_type:content_type={content_type}"
    with fires(vllm, "wrong_content_type", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), spec, trajectory)
    assert reply.headers["content-type"].split(";")[0] == content_type
    assert reply.json()["choices"][0]["token_ids"] == recorded(trajectory).output_ids[:LIMIT]
    resp = chat(vllm, fresh(), spec)
    assert isinstance(resp, openai.types.chat.ChatCompletion) and resp.choices[0].finish_reason == "length"


def test_a_stream_under_another_content_type_still_iterates(vllm: ServerThread) -> None:
    trajectory = fresh()
    reply = raw(vllm, CHAT, chat_body(trajectory, stream=True), "wrong_content_type", trajectory)
    assert reply.headers["content-type"] == "application/octet-stream" and reply.events()[-1] == b"[DONE]"
    chunks = list(chat(vllm, fresh(), "wrong_content_type", stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


# -- transport ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_connection_reset_is_a_connection_error(vllm: ServerThread, stream: bool) -> None:
    trajectory = fresh()
    with fires(vllm, "connection_reset", trajectory), pytest.raises(openai.APIConnectionError):
        chat(vllm, trajectory, "connection_reset", stream=stream)
    record = vllm.context.log.records[-1]
    assert (record.trajectory, record.status, record.error) == (trajectory.id, None, "connection reset by a fault")
    again = fresh()
    assert raw(vllm, CHAT, chat_body(again, stream=stream), "connection_reset", again).status is None


def test_truncated_body_promises_more_than_it_sends(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "truncated_body", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "truncated_body:keep=0.5", trajectory)
    assert reply.status == 200 and not reply.complete
    assert len(reply.body) == int(reply.headers["content-length"]) // 2
    with pytest.raises(openai.APIConnectionError) as caught:  # read inside the SDK's request: wrapped
        chat(vllm, fresh(), "truncated_body")
    assert isinstance(caught.value.__cause__, httpx.RemoteProtocolError)


def test_truncated_stream_tears_an_event_and_raises_remote_protocol_error(vllm: ServerThread) -> None:
    trajectory = fresh()
    reply = raw(vllm, CHAT, chat_body(trajectory, stream=True), "truncated_body:keep=0.5", trajectory)
    assert not reply.complete and b"[DONE]" not in reply.body
    *whole, torn = reply.events()
    assert len(whole) == LIMIT // 2 and all(json.loads(e) for e in whole)
    with pytest.raises(json.JSONDecodeError):
        json.loads(torn)
    again = fresh()
    chunks = []
    with fires(vllm, "truncated_body", again), pytest.raises(httpx.RemoteProtocolError):
        for chunk in chat(vllm, again, "truncated_body:keep=0.5", stream=True):
            chunks.append(chunk)
    assert len(chunks) == LIMIT // 2


def test_a_stream_cut_uncleanly_raises_from_the_iterator(vllm: ServerThread) -> None:
    trajectory = fresh()
    chunks = []
    with fires(vllm, "stream_cut", trajectory), pytest.raises(httpx.RemoteProtocolError):
        for chunk in chat(vllm, trajectory, "stream_cut:after=3", stream=True):
            chunks.append(chunk)
    assert len(chunks) == 3 and all(c.choices[0].finish_reason is None for c in chunks)
    record = vllm.context.log.records[-1]
    assert (record.status, record.error, record.client_disconnected) == (200, "stream cut by a fault", False)


@pytest.mark.parametrize("spec, done", [("stream_cut:after=3,clean=true", False),
                                        ("stream_cut:after=3,done=true", True)])
def test_a_clean_early_end_is_silent(vllm: ServerThread, spec: str, done: bool) -> None:
    trajectory = fresh()
    reply = raw(vllm, CHAT, chat_body(trajectory, stream=True), spec, trajectory)
    assert reply.complete and reply.body.endswith(b"data: [DONE]\n\n") == done
    assert len([e for e in reply.events() if e != b"[DONE]"]) == 3
    again = fresh()
    with fires(vllm, "stream_cut", again):
        chunks = list(chat(vllm, again, spec, stream=True))
    assert len(chunks) == 3 and [c.choices[0].finish_reason for c in chunks] == [None] * 3


def test_stream_cut_leaves_a_whole_answer_alone(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "stream_cut", trajectory):
        resp = chat(vllm, trajectory, "stream_cut:after=1")
    assert resp.choices[0].finish_reason == "length" and len(resp.choices[0].token_ids) == LIMIT
    assert vllm.context.faults.log.events[-1].change == "not a stream: no effect"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_stream_without_finish_reason_still_ends_with_done(vllm: ServerThread, path: str) -> None:
    trajectory = fresh()
    body = chat_body(trajectory, stream=True) if path == CHAT else {
        "prompt": trajectory.prompt.ids, "max_tokens": LIMIT, "stream": True, "return_token_ids": True}
    with fires(vllm, "stream_no_finish_reason", trajectory, endpoint=path):
        reply = raw(vllm, path, body, "stream_no_finish_reason", trajectory)
    *events, done = reply.events()
    assert done == b"[DONE]"
    choices = [json.loads(e)["choices"][0] for e in events]
    assert [c["finish_reason"] for c in choices] == [None] * len(choices)
    assert all(c.get("stop_reason") is None for c in choices)
    assert [t for c in choices for t in c.get("token_ids") or []] == recorded(trajectory).output_ids[:LIMIT]
    chunks = list(chat(vllm, fresh(), "stream_no_finish_reason", stream=True))
    assert len(chunks) == 1 + LIMIT and all(c.choices[0].finish_reason is None for c in chunks)


def test_latency_holds_the_answer(vllm: ServerThread) -> None:
    trajectory = fresh()
    started = time.monotonic()
    with fires(vllm, "latency", trajectory):
        resp = chat(vllm, trajectory, "latency:ms=300")
    assert time.monotonic() - started >= 0.3
    assert resp.choices[0].token_ids == recorded(trajectory).output_ids[:LIMIT]


def test_slow_first_token_delays_the_first_chunk(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "slow_first_token", trajectory):
        started = time.monotonic()
        stream = chat(vllm, trajectory, "slow_first_token:seconds=0.4", stream=True)
        first = next(iter(stream))
        waited = time.monotonic() - started
        rest = list(stream)
    assert waited >= 0.4 and first.choices[0].delta.role == "assistant"
    assert rest[-1].choices[0].finish_reason == "length"


def test_a_stall_times_the_client_out(vllm: ServerThread) -> None:
    trajectory = fresh()
    started = time.monotonic()
    with fires(vllm, "stall", trajectory), pytest.raises(openai.APITimeoutError):
        chat(vllm, trajectory, "stall:seconds=5", timeout=0.5)
    assert time.monotonic() - started < 3
    record = next(r for r in vllm.context.log.records if r.trajectory == trajectory.id)
    for _ in range(50):  # the server notices the client leaving shortly after
        if record.client_disconnected:
            break
        time.sleep(0.02)
    assert record.client_disconnected and record.status is None


# -- logprobs and token ids --------------------------------------------------------------------------
def test_missing_logprobs_are_null(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "missing_logprobs", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "missing_logprobs", trajectory)
    choice = reply.json()["choices"][0]
    assert "logprobs" in choice and choice["logprobs"] is None
    assert choice["token_ids"] == recorded(trajectory).output_ids[:LIMIT]  # verifiers: tokens=None, no error
    chunks = list(chat(vllm, fresh(), "missing_logprobs", stream=True))
    assert all(c.choices[0].logprobs is None for c in chunks) and chunks[-1].choices[0].finish_reason == "length"
    again = fresh()
    with fires(vllm, "missing_logprobs", again, endpoint=COMPLETIONS):
        assert complete(vllm, again, "missing_logprobs").choices[0].logprobs is None


@pytest.mark.parametrize("delta", [-1, 2])
def test_logprob_entries_no_longer_match_the_ids(vllm: ServerThread, delta: int) -> None:
    trajectory = fresh()
    ids = recorded(trajectory).output_ids[:LIMIT]
    with fires(vllm, "logprob_length_mismatch", trajectory):
        resp = chat(vllm, trajectory, f"logprob_length_mismatch:delta={delta}")
    choice = resp.choices[0]
    assert choice.token_ids == ids and len(choice.logprobs.content) == LIMIT + delta
    chunks = list(chat(vllm, fresh(), f"logprob_length_mismatch:delta={delta}", stream=True))
    assert sum(len(c.choices[0].logprobs.content) for c in chunks[1:]) == LIMIT + delta
    assert sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks[1:]) == LIMIT


def test_logprob_mismatch_on_the_renderer_route(vllm: ServerThread) -> None:
    trajectory = fresh()
    body = {"model": "m", "token_ids": trajectory.prompt.ids, "sampling_params": {"max_tokens": LIMIT, "logprobs": 1}}
    with fires(vllm, "logprob_length_mismatch", trajectory, endpoint=GENERATE):
        reply = raw(vllm, GENERATE, body, "logprob_length_mismatch:delta=-2", trajectory)
    choice = reply.json()["choices"][0]
    assert len(choice["token_ids"]) == LIMIT and len(choice["logprobs"]["content"]) == LIMIT - 2
    assert all(e["token"] == f"token_id:{t}" for e, t in zip(choice["logprobs"]["content"], choice["token_ids"]))


def test_a_null_logprob_is_vllms_sentinel_in_chat(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "null_logprob", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "null_logprob:position=2", trajectory)
    values = [e["logprob"] for e in reply.json()["choices"][0]["logprobs"]["content"]]
    assert values[2] == -9999.0 and values[:2] + values[3:] == [
        lp for i, lp in enumerate(recorded(trajectory).logprobs[:LIMIT]) if i != 2]
    chunks = list(chat(vllm, fresh(), "null_logprob", stream=True))
    assert chunks[1].choices[0].logprobs.content[0].logprob == -9999.0


def test_a_null_logprob_is_null_in_vllm_completions(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "null_logprob", trajectory, endpoint=COMPLETIONS):
        resp = complete(vllm, trajectory, "null_logprob")
    logprobs = resp.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # open-instruct's sum breaks
    assert logprobs.token_logprobs[1:] == recorded(trajectory).logprobs[1:LIMIT]


def test_a_null_logprob_is_null_in_sglang_chat(sglang: ServerThread) -> None:
    trajectory = fresh()
    with fires(sglang, "null_logprob", trajectory):
        resp = chat(sglang, trajectory, "null_logprob")
    assert resp.choices[0].logprobs.content[0].logprob is None


def test_nan_logprob_is_a_bare_nan(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "nan_logprob", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "nan_logprob:position=1", trajectory)
    assert b'"logprob":NaN' in reply.body
    resp = chat(vllm, fresh(), "nan_logprob:position=1")
    values = [e.logprob for e in resp.choices[0].logprobs.content]
    assert math.isnan(values[1]) and all(math.isfinite(v) for i, v in enumerate(values) if i != 1)


def test_nan_logprob_in_a_renderer_stream(vllm: ServerThread) -> None:
    trajectory = fresh()
    body = {"model": "m", "token_ids": trajectory.prompt.ids, "stream": True,
            "sampling_params": {"max_tokens": LIMIT, "logprobs": 1}}
    with fires(vllm, "nan_logprob", trajectory, endpoint=GENERATE):
        reply = raw(vllm, GENERATE, body, "nan_logprob", trajectory)
    first = json.loads(reply.events()[0])  # Python's json reads the bare NaN back
    assert math.isnan(first["choices"][0]["logprobs"]["content"][0]["logprob"])


def test_text_without_ids_drops_every_token_id_key(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "text_without_ids", trajectory):
        reply = raw(vllm, CHAT, chat_body(trajectory), "text_without_ids", trajectory)
    body = reply.json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert len(body["choices"][0]["logprobs"]["content"]) == LIMIT and body["choices"][0]["message"]["content"]
    resp = chat(vllm, fresh(), "text_without_ids")
    assert "prompt_token_ids" not in resp.model_extra and "token_ids" not in resp.choices[0].model_extra
    with pytest.raises(AttributeError):
        resp.choices[0].token_ids  # noqa: B018  (what verifiers would read)


def test_text_without_ids_in_streams_and_completions(vllm: ServerThread) -> None:
    trajectory = fresh()
    reply = raw(vllm, CHAT, chat_body(trajectory, stream=True), "text_without_ids", trajectory)
    assert b"token_ids" not in reply.body and reply.events()[-1] == b"[DONE]"
    again = fresh()
    with fires(vllm, "text_without_ids", again, endpoint=COMPLETIONS):
        choice = complete(vllm, again, "text_without_ids").choices[0]
    assert "token_ids" not in choice.model_extra and "prompt_token_ids" not in choice.model_extra
    assert choice.logprobs.token_logprobs == recorded(again).logprobs[:LIMIT]
    third = fresh()
    body = {"model": "m", "token_ids": third.prompt.ids, "sampling_params": {"max_tokens": LIMIT, "logprobs": 1}}
    generated = raw(vllm, GENERATE, body, "text_without_ids", third).json()["choices"][0]
    assert "token_ids" not in generated and len(generated["logprobs"]["content"]) == LIMIT


# -- weight version (SGLang `metadata`) --------------------------------------------------------------
def test_missing_weight_version(sglang: ServerThread, vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(sglang, "missing_weight_version", trajectory):
        resp = chat(sglang, trajectory, "missing_weight_version")
    assert resp.model_extra["metadata"] == {}
    plain = chat(sglang, fresh(), "")
    assert plain.model_extra["metadata"] == {"weight_version": "default"}
    again = fresh()
    with fires(vllm, "missing_weight_version", again):  # vLLM bodies carry no weight version to drop
        assert "metadata" not in chat(vllm, again, "missing_weight_version").model_extra


def test_stale_weight_version(sglang: ServerThread) -> None:
    trajectory = fresh()
    with fires(sglang, "stale_weight_version", trajectory, endpoint=COMPLETIONS):
        resp = complete(sglang, trajectory, "stale_weight_version:behind=2")
    assert resp.model_extra["metadata"] == {"weight_version": "default-stale2"}


def _set_version(server: ServerThread, version: str) -> None:
    answer = request(server.url, "/update_weight_version", {"new_version": version, "abort_all_requests": False})
    assert answer.status == 200


def test_stale_weight_version_on_vllm_holds_the_answer_for_a_newer_policy() -> None:
    """vLLM bodies carry no version (clients stamp the policy at send time): a stale answer is a late one, let
    go only once the server is `behind` versions past the one the request arrived at."""
    with ServerThread("rlvr-500") as server, ThreadPoolExecutor(1) as pool:
        _set_version(server, "3")
        trajectory = fresh()
        with fires(server, "stale_weight_version", trajectory, endpoint=COMPLETIONS):
            answer = pool.submit(complete, server, trajectory, "stale_weight_version:behind=2,idle_s=60")
            time.sleep(0.5)
            _set_version(server, "4")
            time.sleep(0.5)
            assert not answer.done(), "answered while the server was only one version on"
            _set_version(server, "5")
            resp = answer.result(timeout=10)
        assert resp.choices[0].token_ids and "metadata" not in resp.model_extra
        event = server.context.faults.log.events[-1]
        assert event.change == ("held until weight_version 5 (arrived at 3; 30 s at most, or until nothing else "
                                "generated for 60 s)")


@pytest.mark.parametrize("limits", ["hold_s=0.2,idle_s=60", "hold_s=60,idle_s=0.2"])
def test_stale_weight_version_on_vllm_lets_go_when_the_client_cannot_move_on(limits: str) -> None:
    """A trainer that waits for this very answer never publishes the newer policy: the hold ends anyway, once
    nothing else is generating (`idle_s`) or at `hold_s`, whichever comes first (the client gives up at 10 s)."""
    with ServerThread("rlvr-500") as server:
        _set_version(server, "0")
        trajectory = fresh()
        with fires(server, "stale_weight_version", trajectory, endpoint=COMPLETIONS):
            resp = client(server.url, 10).completions.create(
                model="mock-model", prompt=trajectory.prompt.ids, logprobs=1, max_tokens=LIMIT,
                extra_body={"return_token_ids": True},
                extra_headers=headers(trajectory, f"stale_weight_version:behind=1,{limits}"))
        assert resp.choices[0].token_ids
        assert server.context.state.weight_version == "0"


# -- what the model says -------------------------------------------------------------------------------
@pytest.mark.parametrize("server_name", ["vllm", "sglang"])
def test_a_running_abort_keeps_half_the_tokens(request: pytest.FixtureRequest, server_name: str) -> None:
    server: ServerThread = request.getfixturevalue(server_name)
    trajectory = fresh()
    with fires(server, "abort", trajectory):
        resp = chat(server, trajectory, "abort:keep=0.5")
    choice = resp.choices[0]
    assert choice.finish_reason == "abort" and len(choice.logprobs.content) == LIMIT // 2
    assert resp.usage.completion_tokens == LIMIT // 2
    assert server.context.log.records[-1].finish == "abort"
    chunks = list(chat(server, fresh(), "abort:keep=0.5", stream=True))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "abort" and set(finishes[:-1]) == {None}


def test_a_queued_abort_has_no_tokens(vllm: ServerThread) -> None:
    trajectory = fresh()
    with fires(vllm, "abort", trajectory):
        resp = chat(vllm, trajectory, "abort:mode=queued")
    choice = resp.choices[0]
    assert (choice.finish_reason, choice.message.content, choice.token_ids) == ("abort", "", [])
    assert choice.logprobs.content == [] and resp.usage.completion_tokens == 0
    record = vllm.context.log.records[-1]
    assert (record.finish, record.completion_tokens, record.error) == ("abort", 0, "aborted in the waiting queue")
    chunks = list(chat(vllm, fresh(), "abort:mode=queued", stream=True))
    assert [c.choices[0].finish_reason for c in chunks] == [None, "abort"]


@pytest.mark.parametrize("fault, finish", [("empty_completion", "stop"), ("zero_length", "length")])
def test_zero_token_answers(vllm: ServerThread, fault: str, finish: str) -> None:
    trajectory = fresh()
    with fires(vllm, fault, trajectory):
        resp = chat(vllm, trajectory, fault)
    choice = resp.choices[0]
    assert (choice.finish_reason, choice.message.content, choice.token_ids) == (finish, "", [])
    chunks = list(chat(vllm, fresh(), fault, stream=True))
    assert chunks[-1].choices[0].finish_reason == finish
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""


def test_raise_after_generate_poisons_the_text(vllm: ServerThread) -> None:
    """The marker is whole when the request allows it (the reply's own words make room for it); a request
    allowing fewer tokens than the marker takes gets what fits, finish `length`, never more."""
    trajectory = fresh()
    with fires(vllm, "raise_after_generate", trajectory):
        resp = client(vllm.url).chat.completions.create(
            model="mock-model", messages=trajectory.prompt.messages, logprobs=True, max_completion_tokens=24,
            extra_body={"return_token_ids": True}, extra_headers=headers(trajectory, "raise_after_generate"))
    assert POISON_MARKER in resp.choices[0].message.content and resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens <= 24
    short = fresh()
    with fires(vllm, "raise_after_generate", short):
        resp = chat(vllm, short, "raise_after_generate")
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == LIMIT


def test_oversized_tool_output_is_a_parsed_tool_call(vllm: ServerThread) -> None:
    trajectory = fresh()
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    with fires(vllm, "oversized_tool_output", trajectory):
        resp = client(vllm.url).chat.completions.create(
            model="m", messages=trajectory.prompt.messages, tools=tools, max_completion_tokens=1000,
            extra_headers=headers(trajectory, "oversized_tool_output:bytes=5000"))
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "bash"
    assert "5000" in choice.message.tool_calls[0].function.arguments


def test_a_weight_update_aborts_a_running_openai_stream() -> None:
    """`abort_all_on_weight_update`: even `abort_all_requests: false` ends a running choice "abort" (miles#2372)."""
    plan = plan_from_specs(["abort_all_on_weight_update"], seed=3)
    with ServerThread("rlvr-500", time_scale=20, plan=plan) as server:
        trajectory = min(server.context.store.trajectories, key=lambda t: t.turns[0].ttft)
        stream = client(server.url).chat.completions.create(
            model="m", messages=trajectory.prompt_messages, logprobs=True, stream=True,
            extra_body={"return_token_ids": True}, extra_headers={"X-Bench-Trajectory": trajectory.id})
        chunks = [next(iter(stream))]  # the first token is out: the choice is running
        update = request(server.url, "/update_weights_from_disk",
                         {"model_path": "/ckpt/2", "abort_all_requests": False})
        assert update.status == 200 and update.json()["success"] is True
        chunks += list(stream)
        events = [(e.rule, e.trajectory, e.turn, e.attempt, e.endpoint) for e in server.context.faults.log.events]
    assert events == [("abort_all_on_weight_update#0", trajectory.id, 0, 1, "/update_weights_from_disk")]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "abort"
    ids = [t for c in chunks for t in c.choices[0].model_extra.get("token_ids") or []]
    recorded_ids = list(trajectory.turns[0].output_ids)
    assert 0 < len(ids) < len(recorded_ids) and ids == recorded_ids[: len(ids)]
