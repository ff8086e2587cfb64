"""OpenAI-compatible routes against the real `openai` SDK and raw bytes (WIRE.md 3.1-3.4, 5.1)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import openai
import pytest

from bench.server import ServerThread
from bench.server.app import BenchServer, load_context
from bench.trace import Trajectory, open_trace
from bench.trace.shipped import shipped_trace

EOS = 1758
CONTEXT = 4096  # rlvr-500's context length
NO_WORKERS = "No available workers (all circuits open or unhealthy)"


def _trajectories(name: str, count: int) -> list[Trajectory]:
    with open_trace(shipped_trace(name)) as reader:
        return [t for _, t in zip(range(count), reader)]


RLVR = _trajectories("rlvr-500", 8)


@pytest.fixture(scope="module")
def server(vllm: ServerThread) -> ServerThread:
    return vllm


def _client(url: str, trajectory: Trajectory | None = None) -> openai.OpenAI:
    headers = {"X-Bench-Trajectory": trajectory.id} if trajectory else None
    return openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, default_headers=headers)


def _post(url: str, path: str, body: Any = None, *, raw: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _events(body: bytes) -> list[Any]:
    """SSE payloads (JSON-decoded) after checking `data: ...\\n\\n` framing and the `[DONE]` terminator."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-120:]
    parts = body[:-2].split(b"\n\n")
    assert all(p.startswith(b"data: ") for p in parts), parts
    return [json.loads(p[6:]) for p in parts[:-1]]


def _as(trajectory: Trajectory) -> dict[str, str]:
    return {"X-Bench-Trajectory": trajectory.id}


def _recorded(trajectory: Trajectory, turn: int = 0):  # type: ignore[no-untyped-def]
    return trajectory.turns[turn].response


# -- vLLM flavor, chat -----------------------------------------------------------------------
def test_chat_replays_the_recorded_tokens_and_logprobs(server: ServerThread) -> None:
    trajectory = RLVR[0]
    recorded = _recorded(trajectory)
    resp = _client(server.url, trajectory).chat.completions.create(
        model="mock-model", messages=trajectory.prompt.messages, logprobs=True, max_completion_tokens=1024,
        temperature=1.0, top_p=1.0, extra_body={"top_k": -1, "min_p": 0.0, "return_token_ids": True,
                                                "cache_salt": "0"})
    choice = resp.choices[0]
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert resp.prompt_token_ids == trajectory.prompt.ids
    assert choice.token_ids == recorded.output_ids and choice.token_ids[-1] == EOS
    assert [c.logprob for c in choice.logprobs.content] == recorded.logprobs
    assert [c.token for c in choice.logprobs.content][:3] == [
        server.context.tokenizer.decode([t]) for t in recorded.output_ids[:3]]
    assert choice.message.content == recorded.text
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] is None
    assert resp.usage.prompt_tokens == len(trajectory.prompt.ids)
    assert resp.usage.completion_tokens == len(recorded.output_ids)


def test_chat_body_keeps_vllm_key_order_and_nulls(server: ServerThread) -> None:
    trajectory = RLVR[1]
    status, headers, raw = _post(server.url, "/v1/chat/completions", {
        "messages": trajectory.prompt.messages, "logprobs": True, "max_completion_tokens": 4,
        "return_tokens_as_token_ids": True}, headers=_as(trajectory))
    assert status == 200 and headers["content-type"].startswith("application/json")
    body = json.loads(raw)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "prompt_logprobs",
                          "prompt_token_ids", "kv_transfer_params"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"])
    assert body["prompt_token_ids"] is None  # not asked for: null, not absent
    choice = body["choices"][0]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids"]
    assert choice["token_ids"] is None and choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": choice["message"]["content"], "tool_calls": [],
                                 "reasoning": None}
    entry = choice["logprobs"]["content"][0]
    first = _recorded(trajectory).output_ids[0]
    assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
    assert entry["token"] == f"token_id:{first}"
    assert entry["bytes"] == list(server.context.tokenizer.token_bytes(first))
    assert list(body["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]


def test_chat_stream_with_token_ids_and_usage(server: ServerThread) -> None:
    trajectory = RLVR[2]
    recorded = _recorded(trajectory)
    stream = _client(server.url, trajectory).chat.completions.create(
        model="m", messages=trajectory.prompt.messages, logprobs=True, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
    chunks = list(stream)
    assert chunks[0].model_extra["prompt_token_ids"] == trajectory.prompt.ids
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all("prompt_token_ids" not in c.model_extra for c in chunks[1:])
    body = [c for c in chunks if c.choices]
    ids = [t for c in body[1:] for t in c.choices[0].model_extra["token_ids"]]
    assert ids == recorded.output_ids
    assert [e.logprob for c in body[1:] for e in c.choices[0].logprobs.content] == recorded.logprobs
    assert "".join(c.choices[0].delta.content or "" for c in body) == recorded.text
    assert [c.choices[0].finish_reason for c in body][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(recorded.output_ids)
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_chunks_omit_unset_fields(server: ServerThread) -> None:
    trajectory = RLVR[3]
    status, headers, raw = _post(server.url, "/v1/chat/completions", {
        "messages": trajectory.prompt.messages, "max_completion_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}}, headers=_as(trajectory))
    assert status == 200 and headers["content-type"] == "text/event-stream"
    events = _events(raw)
    assert list(events[0]) == ["id", "object", "created", "model", "choices", "prompt_token_ids"]
    assert events[0]["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None}
    assert list(events[1]["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    assert list(events[1]) == ["id", "object", "created", "model", "choices"]
    assert list(events[3]["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "stop_reason",
                                             "token_ids"]
    assert events[3]["choices"][0]["finish_reason"] == "length"
    assert events[4] == {"id": events[0]["id"], "object": "chat.completion.chunk", "created": events[0]["created"],
                         "model": events[0]["model"], "choices": [],
                         "usage": {"prompt_tokens": len(trajectory.prompt.ids), "total_tokens":
                                   len(trajectory.prompt.ids) + 3, "completion_tokens": 3}}


def test_max_completion_tokens_cuts_with_length(server: ServerThread) -> None:
    trajectory = RLVR[4]
    recorded = _recorded(trajectory)
    client = _client(server.url, trajectory)
    for limit in ({"max_completion_tokens": 5}, {"max_tokens": 5}):
        resp = client.chat.completions.create(model="m", messages=trajectory.prompt.messages, logprobs=True,
                                              extra_body={"return_token_ids": True}, **limit)
        choice = resp.choices[0]
        assert choice.finish_reason == "length"
        assert choice.token_ids == recorded.output_ids[:5]
        assert [c.logprob for c in choice.logprobs.content] == recorded.logprobs[:5]
        assert resp.usage.completion_tokens == 5


def test_stop_string_cuts_and_is_reported(server: ServerThread) -> None:
    trajectory = RLVR[5]
    text = _recorded(trajectory).text
    stop = text.split()[3]
    client = _client(server.url, trajectory)
    resp = client.chat.completions.create(model="m", messages=trajectory.prompt.messages, stop=[stop])
    assert resp.choices[0].message.content == text[:text.find(stop)]
    assert resp.choices[0].finish_reason == "stop" and resp.choices[0].model_extra["stop_reason"] == stop
    kept = client.chat.completions.create(model="m", messages=trajectory.prompt.messages, stop=stop,
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content.endswith(stop)


# -- errors ------------------------------------------------------------------------------------
def test_context_length_is_a_bad_request_with_vllm_text(server: ServerThread) -> None:
    trajectory = RLVR[0]
    client = _client(server.url, trajectory)
    expected = (f"This model's maximum context length is {CONTEXT} tokens. However, you requested 5000 output "
                f"tokens and your prompt contains 94 input tokens, for a total of 5094 tokens. Please reduce the "
                f"length of the input prompt or the number of requested output tokens. "
                f"(parameter=input_tokens, value=94)")
    for stream in (False, True):  # vLLM refuses before the stream starts: a plain 400 either way
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=trajectory.prompt.messages,
                                           max_completion_tokens=5000, stream=stream)
        assert caught.value.status_code == 400
        assert caught.value.body["message"] == expected
        assert caught.value.body["type"] == "BadRequestError" and caught.value.body["code"] == 400
    record = [r for r in server.context.log.records if r.endpoint == "/v1/chat/completions"][-1]
    assert record.status == 400 and record.trajectory == trajectory.id and record.error == expected


def test_router_without_workers_is_an_internal_server_error(server: ServerThread) -> None:
    assert _post(server.url, "/bench/workers", {"available": False})[0] == 200
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            _client(server.url).chat.completions.create(model="m", messages=RLVR[0].prompt.messages)
        assert caught.value.status_code == 503 and NO_WORKERS in str(caught.value)
    finally:
        assert _post(server.url, "/bench/workers", {"available": True})[0] == 200


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", b"[1, 2]"),
    ("/v1/chat/completions", b'{"model": "m"}'),
    ("/v1/chat/completions", b'{"messages": "hello"}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}'),
    ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 0}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stream_options": {}}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "cache_salt": ""}'),
    ("/v1/completions", b'{"model": "m"}'),
    ("/v1/completions", b'{"prompt": []}'),
    ("/v1/completions", b'{"prompt": [1, "a", 3]}'),
    ("/v1/completions", b'{"prompt": [999999]}'),
    ("/v1/completions", b'{"prompt": "hi", "stop": 3}'),
    ("/inference/v1/generate", b'{"sampling_params": {}}'),
    ("/inference/v1/generate", b'{"token_ids": [1, 2], "sampling_params": {"max_tokens": "x"}}'),
])
def test_malformed_bodies_get_a_400_envelope(server: ServerThread, path: str, raw: bytes) -> None:
    status, headers, body = _post(server.url, path, raw=raw)
    assert status == 400 and headers["content-type"].startswith("application/json"), body
    error = json.loads(body)["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert error["code"] == 400 and error["type"] in ("Bad Request", "BadRequestError") and error["message"]


def test_sdk_sees_value_errors_as_bad_requests(server: ServerThread) -> None:
    client = _client(server.url)
    with pytest.raises(openai.BadRequestError, match="n must be at least 1"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=0)
    with pytest.raises(openai.BadRequestError, match="min_tokens must be less than or equal to max_tokens=2"):
        client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"min_tokens": 3})


# -- async client, n > 1 ---------------------------------------------------------------------
def test_async_client_n_choices_are_identified_separately() -> None:
    group = RLVR[:4]  # one GRPO group: identical prompts, told apart by arrival order

    async def main() -> None:
        async with BenchServer("rlvr-500") as bench:
            client = openai.AsyncOpenAI(base_url=bench.url + "/v1", api_key="bench", max_retries=0)
            resp = await client.chat.completions.create(model="m", messages=group[0].prompt.messages, n=2,
                                                        logprobs=True, extra_body={"return_token_ids": True})
            assert [c.index for c in resp.choices] == [0, 1]
            assert [c.token_ids for c in resp.choices] == [_recorded(t).output_ids for t in group[:2]]
            assert resp.usage.completion_tokens == sum(len(_recorded(t).output_ids) for t in group[:2])
            stream = await client.chat.completions.create(model="m", messages=group[0].prompt.messages, n=2,
                                                          stream=True, extra_body={"return_token_ids": True})
            ids: dict[int, list[int]] = {0: [], 1: []}
            finishes = {}
            async for chunk in stream:
                for choice in chunk.choices:
                    ids[choice.index] += choice.model_extra.get("token_ids") or []
                    if choice.finish_reason:
                        finishes[choice.index] = choice.finish_reason
            assert [ids[0], ids[1]] == [_recorded(t).output_ids for t in group[2:]]
            assert finishes == {0: "stop", 1: "stop"}
            records = bench.log.records
            assert [r.trajectory for r in records] == [t.id for t in group]
            assert all(r.status == 200 and r.finish == "stop" and r.turn == 0 and r.attempt == 1 for r in records)
            assert len({r.rid for r in records}) == 4 and not bench.context.state.inflight

    asyncio.run(main())


# -- completions ---------------------------------------------------------------------------------
def test_completions_with_token_prompt_like_open_instruct(server: ServerThread) -> None:
    trajectory = RLVR[6]
    recorded = _recorded(trajectory)
    prompt = trajectory.prompt.ids
    resp = _client(server.url, trajectory).completions.create(
        model="m", prompt=prompt, max_tokens=CONTEXT - len(prompt), logprobs=1,
        extra_body={"return_token_ids": True, "cache_salt": "s1", "include_stop_str_in_output": True,
                    "skip_special_tokens": False, "min_tokens": 1})
    choice = resp.choices[0]
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert choice.token_ids == recorded.output_ids and choice.model_extra["prompt_token_ids"] == prompt
    assert choice.logprobs.token_logprobs == recorded.logprobs
    assert choice.logprobs.tokens[-1] == "<|im_end|>" and choice.text == recorded.text + "<|im_end|>"
    offsets = choice.logprobs.text_offset
    assert offsets[0] == 0 and offsets[1] == len(choice.logprobs.tokens[0])
    assert choice.logprobs.top_logprobs[0] == {choice.logprobs.tokens[0]: recorded.logprobs[0]}


def test_completions_batch_of_prompts_and_stream(server: ServerThread) -> None:
    client = _client(server.url)
    prompts = [RLVR[0].prompt.ids, RLVR[4].prompt.ids]
    resp = client.completions.create(model="m", prompt=prompts, max_tokens=3, extra_body={"return_token_ids": True})
    assert [c.index for c in resp.choices] == [0, 1]
    assert [c.model_extra["prompt_token_ids"] for c in resp.choices] == prompts
    assert resp.usage.prompt_tokens == sum(map(len, prompts)) and resp.usage.completion_tokens == 6
    whole = client.completions.create(model="m", prompt="Tell me a story", max_tokens=12)
    chunks = list(client.completions.create(model="m", prompt="Tell me a story", max_tokens=12, stream=True,
                                            extra_body={"return_token_ids": True}))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == server.context.tokenizer.encode("Tell me a story")
    assert all(c.choices[0].model_extra["prompt_token_ids"] is None for c in chunks[1:])
    assert sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks) == 12
    assert chunks[-1].choices[0].finish_reason == "length"


# -- /inference/v1/generate ---------------------------------------------------------------------
def test_inference_generate_round_trip(server: ServerThread) -> None:
    trajectory = RLVR[7]
    recorded = _recorded(trajectory)
    request = {"model": "mock-model", "token_ids": trajectory.prompt.ids,
               "sampling_params": {"max_tokens": 1024, "stop_token_ids": [EOS], "logprobs": 1,
                                   "skip_special_tokens": False}, "cache_salt": "abc", "priority": 0}
    status, _, raw = _post(server.url, "/inference/v1/generate", request, headers=_as(trajectory))
    body = json.loads(raw)
    assert status == 200 and list(body) == ["request_id", "choices", "prompt_logprobs", "kv_transfer_params"]
    assert body["request_id"].startswith("generate-tokens-")
    choice = body["choices"][0]
    assert list(choice) == ["index", "logprobs", "finish_reason", "token_ids"]
    assert choice["token_ids"] == recorded.output_ids and choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in recorded.output_ids]
    assert [e["logprob"] for e in content] == recorded.logprobs
    assert content[0]["bytes"] is None and content[0]["top_logprobs"] == [
        {"token": content[0]["token"], "logprob": content[0]["logprob"], "bytes": None}]
    status, _, raw = _post(server.url, "/inference/v1/generate",
                           request | {"stream": True, "stream_options": {"include_usage": True}},
                           headers=_as(trajectory))
    events = _events(raw)
    assert status == 200 and all(set(e) == {"request_id", "choices"} for e in events[:-1])
    assert [t for e in events[:-1] for t in e["choices"][0]["token_ids"]] == recorded.output_ids
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(recorded.output_ids)


def test_inference_generate_is_not_an_sglang_route(sglang: ServerThread) -> None:
    status, _, _ = _post(sglang.url, "/inference/v1/generate", {"token_ids": [1, 2, 3]})
    assert status == 404


# -- SGLang flavor ---------------------------------------------------------------------------
def test_sglang_flavor_chat_shape() -> None:
    trajectory = RLVR[0]
    recorded = _recorded(trajectory)

    async def main() -> None:
        context = load_context("rlvr-500", openai_flavor="sglang")
        async with BenchServer(context=context) as bench, aiohttp.ClientSession() as session:
            body = {"messages": trajectory.prompt.messages, "logprobs": True}
            async with session.post(bench.url + "/v1/chat/completions", json=body, headers=_as(trajectory)) as resp:
                assert resp.status == 200
                data = json.loads(await resp.read())
            assert list(data) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
            assert re.fullmatch(r"[0-9a-f]{32}", data["id"]) and data["metadata"] == {"weight_version": "default"}
            choice = data["choices"][0]
            assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
            assert choice["message"] == {"role": "assistant", "content": recorded.text, "reasoning_content": None,
                                         "tool_calls": None}
            assert choice["finish_reason"] == "stop" and choice["matched_stop"] == EOS
            assert list(choice["logprobs"]["content"][0]) == ["token", "bytes", "logprob", "top_logprobs"]
            assert [e["logprob"] for e in choice["logprobs"]["content"]] == recorded.logprobs
            assert list(data["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens",
                                           "prompt_tokens_details", "reasoning_tokens"]
            client = openai.AsyncOpenAI(base_url=bench.url + "/v1", api_key="bench", max_retries=0)
            resp = await client.chat.completions.create(model="m", messages=trajectory.prompt.messages,
                                                        extra_headers=_as(trajectory))
            assert "prompt_token_ids" not in resp.model_extra and "token_ids" not in resp.choices[0].model_extra
            assert resp.model_extra["metadata"]["weight_version"] == "default"
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=trajectory.prompt.messages,
                                                     max_completion_tokens=5000)
            assert caught.value.body == {"object": "error", "message": (
                "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a "
                "total of 5094 tokens: 94 tokens from the input messages and 5000 tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to fit within the "
                "limit."), "type": "BadRequestError", "param": None, "code": 400}

    asyncio.run(main())


def test_sglang_flavor_stream_shape_and_in_band_errors(sglang: ServerThread) -> None:
    trajectory = RLVR[1]
    status, _, raw = _post(sglang.url, "/v1/chat/completions", {
        "messages": trajectory.prompt.messages, "max_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True}}, headers=_as(trajectory))
    events = _events(raw)
    assert status == 200
    assert events[0]["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": "",
                                                             "reasoning_content": None, "tool_calls": None},
                                       "logprobs": None, "finish_reason": None, "matched_stop": None}
    assert list(events[0]) == ["id", "object", "created", "model", "choices", "usage"] and events[0]["usage"] is None
    assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-2]["choices"][0]["matched_stop"] is None
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2
    status, _, raw = _post(sglang.url, "/v1/chat/completions", {
        "messages": trajectory.prompt.messages, "max_tokens": 5000, "stream": True})
    assert status == 200  # SGLang refuses inside the stream
    [event] = _events(raw)
    assert event["error"]["object"] == "error" and event["error"]["code"] == 400
    assert event["error"]["message"].startswith("Requested token count exceeds")
    stream = _client(sglang.url).chat.completions.create(model="m", messages=trajectory.prompt.messages,
                                                         max_tokens=5000, stream=True)
    with pytest.raises(openai.APIError, match="Requested token count exceeds"):
        list(stream)


def test_sglang_flavor_malformed_body_is_flat(sglang: ServerThread) -> None:
    status, _, raw = _post(sglang.url, "/v1/completions", raw=b'{"prompt": 7')
    body = json.loads(raw)
    assert status == 400 and list(body) == ["object", "message", "type", "param", "code"]
    assert body["object"] == "error" and body["code"] == 400


# -- tool calls ------------------------------------------------------------------------------
def test_tool_calls_parsed_and_echoed_back_to_the_next_turn() -> None:
    [trajectory] = [t for t in _trajectories("agentic-500", 1)]
    first, second = trajectory.turns[0], trajectory.turns[1]
    assert first.tool_calls, "the first agentic trajectory starts with a tool call"
    with ServerThread("agentic-500") as thread:
        client = _client(thread.url, trajectory)
        messages = list(trajectory.prompt.messages)
        resp = client.chat.completions.create(model="m", messages=messages, tools=trajectory.prompt.tools,
                                              extra_body={"return_token_ids": True})
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.token_ids == first.response.output_ids
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
            (c.name, c.arguments) for c in first.tool_calls]
        assert choice.message.tool_calls[0].id.startswith("chatcmpl-tool-")
        assert choice.message.content == first.response.text[:first.response.text.find("<tool_call>")].rstrip("\n")
        messages.append(choice.message.model_dump(include={"role", "content", "tool_calls"}))
        for call, output in zip(choice.message.tool_calls, first.tool_outputs):
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output.text})
        resp = client.chat.completions.create(model="m", messages=messages, tools=trajectory.prompt.tools,
                                              extra_body={"return_token_ids": True})
        assert resp.prompt_token_ids == trajectory.request_input_ids(1)
        assert resp.choices[0].token_ids == second.response.output_ids
        record = thread.context.log.records[-1]
        assert (record.trajectory, record.turn, record.drift, record.attempt) == (trajectory.id, 1, None, 1)
        chunks = list(client.chat.completions.create(model="m", messages=trajectory.prompt.messages,
                                                     tools=trajectory.prompt.tools, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
        calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
        assert [(c.index, c.function.name, c.function.arguments) for c in calls] == [
            (0, first.tool_calls[0].name, first.tool_calls[0].arguments)]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert all("<tool_call>" not in (c.choices[0].delta.content or "") for c in chunks)


# -- timing, abort, disconnect ---------------------------------------------------------------
def test_pacing_follows_the_recording_scaled() -> None:
    trajectory = RLVR[2]  # ttft 0.0384 s, total 1.353 s
    with ServerThread("rlvr-500", time_scale=0.2) as thread:
        started = time.monotonic()
        _client(thread.url, trajectory).chat.completions.create(model="m", messages=trajectory.prompt.messages)
        elapsed = time.monotonic() - started
        [record] = thread.context.log.records
    assert elapsed >= 1.353 * 0.2 * 0.9
    assert record.endpoint == "/v1/chat/completions" and record.latency_s >= 1.353 * 0.2 * 0.9
    assert (record.status, record.finish, record.completion_tokens) == (200, "stop", 71)


def _wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_abort_returns_partial_output_with_abort_finish() -> None:
    trajectory = RLVR[0]  # 131 tokens over ~4.4 s at time_scale 1
    with ServerThread("rlvr-500", time_scale=1.0) as thread:
        result: dict[str, Any] = {}

        def call() -> None:
            result["resp"] = _client(thread.url, trajectory).chat.completions.create(
                model="m", messages=trajectory.prompt.messages, logprobs=True, extra_body={"return_token_ids": True})

        caller = threading.Thread(target=call)
        caller.start()
        state = thread.context.state
        _wait_until(lambda: any(e.prefilled for e in list(state.inflight.values())))
        time.sleep(0.5)
        assert _post(thread.url, "/abort_request", {"abort_all": True})[0] == 200
        caller.join(10)
        choice = result["resp"].choices[0]
        done = len(choice.token_ids)
        assert choice.finish_reason == "abort" and 0 < done < len(_recorded(trajectory).output_ids)
        assert choice.token_ids == _recorded(trajectory).output_ids[:done] and len(choice.logprobs.content) == done
        [record] = [r for r in thread.context.log.records if r.endpoint == "/v1/chat/completions"]
        assert (record.finish, record.completion_tokens) == ("abort", done) and not state.inflight


def test_client_disconnect_mid_stream_is_logged() -> None:
    trajectory = RLVR[3]

    async def main() -> None:
        async with BenchServer("rlvr-500", time_scale=1.0) as bench, aiohttp.ClientSession() as session:
            body = {"messages": trajectory.prompt.messages, "stream": True}
            async with session.post(bench.url + "/v1/chat/completions", json=body, headers=_as(trajectory)) as resp:
                assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
                await resp.content.readuntil(b"\n\n")
            for _ in range(300):
                if bench.log.records and bench.log.records[-1].client_disconnected and not bench.context.state.inflight:
                    break
                await asyncio.sleep(0.01)
            record = bench.log.records[-1]
            assert record.client_disconnected and record.trajectory == trajectory.id
            assert not bench.context.state.inflight

    asyncio.run(main())


def test_chat_prompt_ids_are_cached_by_text_and_callers_get_their_own_list() -> None:
    from bench.server.openai_request import _prompt_ids, _render_chat
    from bench.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    _prompt_ids.cache_clear()
    first = _render_chat(messages, None, tokenizer)
    first.append(-1)  # a caller extending its prompt must not change the cached one
    second = _render_chat(messages, None, tokenizer)
    assert second == expected and first is not second
    assert _prompt_ids.cache_info().hits == 1 and _prompt_ids.cache_info().misses == 1
    assert _render_chat([{"role": "user", "content": "What is 3+3?"}], None, tokenizer) != expected
