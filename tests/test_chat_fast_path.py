"""The chat route's fast path (bench/server/openai_fast.py) answers exactly as its slow path does.

Every recorded turn of every shipped trace with chat messages (rlvr-500, agentic-500: each turn's conversation built
from the bench's own answers and the recorded tool outputs, as a chat client sends it) goes through the real handler
twice, once with the fast path and once without, in the vLLM and SGLang flavors (and SGLang's legacy context check),
under request shapes in rotation (logprobs on or off, top logprobs, token ids, tokens as ids, a client request id, a
cut, stop strings, special tokens shown, a budget past the context, no tools): the answers must be the same bytes but
for `id`, `created` and the tool call ids, and the request log and the served-token store must hold the same.
Bodies the fast path does not take fall back, a fault that fires takes the slow path, and the fast path answers as
many event-loop iterations after arriving as the slow path does.
"""

from __future__ import annotations

import asyncio
import json
import re
from functools import lru_cache
from typing import Any

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from bench.server import openai_routes, wire
from bench.server.app import create_app, load_context
from bench.server.context import ServerContext
from bench.server.openai_fast import EntryTemplates
from bench.server.openai_format import OpenAIFormatter
from bench.server.openai_request import parse_chat
from bench.tokenizer import load_tokenizer
from bench.trace import open_trace
from bench.trace.shipped import shipped_trace
from faults import plan_from_specs
from tests.server_helpers import ReadingProtocol, counting_loop_iterations

CHAT = "/v1/chat/completions"
TRACES = {"rlvr-500": 500, "agentic-500": 5695}  # every shipped trace with chat messages, and its turns
VOLATILE = re.compile(rb'"(id)":"[^"]*"|"(created)":[0-9]+')
LOG_FIELDS = ("endpoint", "rid", "trajectory", "group", "turn", "drift", "by_order", "stream", "status",
              "prompt_tokens", "completion_tokens", "finish", "client_disconnected", "error", "served_tokens",
              "served_digest", "weight_version", "logprobs_served", "continues")
# request shapes in rotation (on top of model, messages and the tools); "client_id" sends the flavor's own key
SHAPES: list[dict[str, Any]] = [
    {"logprobs": True, "return_token_ids": True},  # the whole answer (it carries the conversation on)
    {"logprobs": True, "return_token_ids": True, "max_completion_tokens": 1024, "temperature": 1.0, "top_p": 1.0},
    {},
    {"logprobs": True, "top_logprobs": 2, "client_id": True},
    {"logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True, "max_tokens": 7},
    {"logprobs": True, "stop": [" the", "\n\n"], "include_stop_str_in_output": True, "no_stop_trim": True},
    {"logprobs": False, "return_token_ids": True, "skip_special_tokens": False, "client_id": True},
    {"logprobs": True, "max_completion_tokens": 10**6},  # past the context: refused, by the slow path
    {"logprobs": True, "return_prompt_token_ids": True, "stop_token_ids": [13], "ignore_eos": True},
    {"logprobs": True, "return_token_ids": True, "no_tools": True},  # an unknown prompt where the trace has tools
]


class Caller:
    """The real chat handler on real aiohttp requests (no socket); the request's protocol, writer and transport are
    made once (`make_mocked_request` makes a dozen mocks per request otherwise)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        app.freeze()  # as a running server's: its signals (served headers on a stream) can be sent
        first = make_mocked_request("POST", CHAT, app=app)
        self.parts = {"protocol": first.protocol, "writer": first._payload_writer, "transport": first.transport}

    def request(self, raw: bytes, headers: dict[str, str]) -> web.Request:
        payload = StreamReader(ReadingProtocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        payload.feed_data(raw)
        payload.feed_eof()
        return make_mocked_request("POST", CHAT, headers={"Content-Type": "application/json",
                                                          "Content-Length": str(len(raw)), **headers},
                                   app=self.app, payload=payload, **self.parts)

    async def __call__(self, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
        return await openai_routes.chat_completions(self.request(json.dumps(body).encode(), headers))  # type: ignore


def _normal(body: bytes) -> bytes:
    """Ids and times blanked: the fast and slow answers' own (a client request id shows as it was sent)."""
    return VOLATILE.sub(lambda m: b'"' + (m.group(1) or m.group(2)) + b'":"-"', body)


def _log_row(ctx: ServerContext, index: int) -> tuple[Any, ...]:
    record = ctx.log.records[index]
    entry = ctx.served.entry_of(record)
    served = None if entry is None else (list(ctx.served.tokens(entry)), [round(v, 9) if v == v else "nan"
                                                                           for v in ctx.served.logprobs_of(entry)],
                                         entry.logprobs_shown, entry.link, entry.context_digest, entry.parent)
    rid = record.rid if record.rid and "-" in record.rid else "made up"  # the test's ids hold a dash, made-up ones not
    return tuple(getattr(record, f) for f in LOG_FIELDS if f != "rid") + (rid, served)


@lru_cache(maxsize=None)
def _tool_outputs(trace: str) -> dict[str, list[list[tuple[str, str]]]]:
    """(call id, output) of each recorded turn's tool calls, per trajectory."""
    with open_trace(shipped_trace(trace)) as reader:
        return {t.id: [[(o.call_id, o.text) for o in turn.tool_outputs] for turn in t.turns] for t in reader}


def _assistant(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer's message as a chat client echoes it back."""
    message = answer["choices"][0]["message"]
    echoed = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        echoed["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]}
                                for c in message["tool_calls"]]
    return echoed


def _body(trajectory: Any, messages: list[dict[str, Any]], shape: dict[str, Any], flavor: str,
          rid: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if trajectory.prompt_tools and not shape.get("no_tools"):
        body["tools"] = trajectory.prompt_tools
    for key, value in shape.items():
        if key == "client_id":
            body["rid" if flavor == "sglang" else "request_id"] = rid
        elif key in ("no_tools",):
            continue
        elif key == "no_stop_trim" and flavor != "sglang" or key == "include_stop_str_in_output" and flavor == "sglang":
            continue  # the other flavor's name for it
        else:
            body[key] = value
    return body


FLAVORS = [("vllm", "0.5.15"), ("sglang", "0.5.15"), ("sglang", "0.4.10")]  # SGLang's legacy context check


async def _compare(trace: str, shapes_per_turn: int) -> dict[tuple[str, str], dict[str, int]]:
    """Every turn in every flavor, the flavors in step (each turn's prompt is rendered and encoded once: the three
    share the tokenizer's prompt cache); the conversation goes on with the vLLM server's whole answer."""
    servers = []
    for flavor, profile in FLAVORS:
        ctx = load_context(trace, sglang_version=profile, openai_flavor=flavor)
        servers.append((flavor, profile, ctx, Caller(create_app(ctx))))
    outputs = _tool_outputs(trace)
    counts = {(flavor, profile): {"compared": 0, "fast": 0, "identified": 0, "recorded_prompts": 0, "turns": 0}
              for flavor, profile in FLAVORS}
    for trajectory in servers[0][2].store.trajectories:
        messages = list(trajectory.prompt_messages)
        headers = {"X-Bench-Trajectory": trajectory.id}
        for turn in range(len(trajectory.turns)):
            echoed = None
            for number in range(shapes_per_turn):
                shape = SHAPES[(trajectory.index + turn + number * 3) % len(SHAPES)]
                rid = f"{trajectory.id}-{turn}-{number}"
                for flavor, profile, ctx, call in servers:
                    count = counts[flavor, profile]
                    body = _body(trajectory, messages, shape, flavor, rid)
                    count["recorded_prompts"] += not (shape.get("no_tools") and trajectory.prompt_tools)
                    answers, rows = [], []
                    for fast in (True, False):
                        ctx.fast_path = fast
                        before = ctx.chat_replies.hits + ctx.chat_replies.saved
                        answer = await call(body, headers)
                        if fast:
                            count["fast"] += ctx.chat_replies.hits + ctx.chat_replies.saved > before
                            record = ctx.log.records[-1]
                            count["identified"] += record.turn == turn and record.drift is None
                        answers.append((answer.status, answer.content_type, _normal(answer.body)))
                        rows.append(_log_row(ctx, len(ctx.log) - 1))
                    assert answers[0] == answers[1], (flavor, profile, trajectory.id, turn, shape)
                    assert rows[0] == rows[1], (flavor, profile, trajectory.id, turn, shape)
                    count["compared"] += 1
                    if shape is SHAPES[0] and flavor == "vllm":
                        echoed = json.loads(answer.body)
            if echoed is None:  # the conversation goes on with the whole answer, as a client's would
                _, _, ctx, call = servers[0]
                ctx.fast_path = True
                echoed = json.loads((await call(_body(trajectory, messages, SHAPES[0], "vllm", ""), headers)).body)
            for count in counts.values():
                count["turns"] += 1
            if turn + 1 < len(trajectory.turns):
                messages = [*messages, _assistant(echoed),
                            *({"role": "tool", "tool_call_id": call_id, "content": text}
                              for call_id, text in outputs[trajectory.id][turn])]
    return counts


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_fast_answers_are_the_slow_paths_bytes_for_every_turn(trace: str) -> None:
    shapes = 3 if trace == "rlvr-500" else 1
    for (flavor, profile), counts in asyncio.run(_compare(trace, shapes)).items():
        assert counts["turns"] == TRACES[trace], (flavor, profile)
        assert counts["compared"] == TRACES[trace] * shapes, (flavor, profile)
        # the conversations are the recorded ones: every request but those leaving out the trace's tools is
        # identified as its turn
        assert counts["identified"] == counts["recorded_prompts"], (flavor, profile, counts)
        # and most answers came from the fast path (refused budgets and unknown prompts are the slow path's)
        assert counts["fast"] >= counts["compared"] * 0.7, (flavor, profile, counts)


def test_the_benchmark_shape_for_every_trajectory_of_rlvr() -> None:
    """benchmarks/peer_servers.py's requests, each answered twice by the fast path (the second from the saved reply)
    and once by the slow path; SGLang's answers report the weight version at their finish."""
    async def run(flavor: str) -> None:
        ctx = load_context("rlvr-500", openai_flavor=flavor)
        call = Caller(create_app(ctx))
        for trajectory in ctx.store.trajectories:
            body = {"model": "m", "messages": trajectory.prompt_messages, "logprobs": True, "return_token_ids": True,
                    "max_completion_tokens": 1024, "temperature": 1.0, "top_p": 1.0}
            answers = []
            for fast in (True, True, False):
                ctx.fast_path = fast
                answer = await call(body, {"X-Bench-Trajectory": trajectory.id})
                answers.append((answer.status, _normal(answer.body)))
            assert answers[0] == answers[1] == answers[2], trajectory.id
        assert len(ctx.chat_replies) == len(ctx.store.trajectories)
        assert ctx.chat_replies.hits == len(ctx.store.trajectories)
        ctx.state.weight_version = "17"
        ctx.fast_path = True
        trajectory = ctx.store.trajectories[0]
        answer = json.loads((await call({"model": "m", "messages": trajectory.prompt_messages, "logprobs": True,
                                         "return_token_ids": True, "max_completion_tokens": 1024, "temperature": 1.0,
                                         "top_p": 1.0}, {"X-Bench-Trajectory": trajectory.id})).body)
        assert ctx.log.records[-1].weight_version == "17"
        assert ("metadata" in answer) == (flavor == "sglang")
        if flavor == "sglang":
            assert answer["metadata"] == {"weight_version": "17"}

    for flavor in ("vllm", "sglang"):
        asyncio.run(run(flavor))


def test_tool_call_ids_are_new_in_every_answer() -> None:
    async def run() -> None:
        ctx = load_context("agentic-500")
        call = Caller(create_app(ctx))
        trajectory = ctx.store.trajectories[0]
        body = {"model": "m", "messages": trajectory.prompt_messages, "tools": trajectory.prompt_tools}
        ids = []
        for _ in range(3):
            answer = json.loads((await call(body, {"X-Bench-Trajectory": trajectory.id})).body)
            ids += [c["id"] for c in answer["choices"][0]["message"]["tool_calls"]]
        assert ctx.chat_replies.hits == 2
        assert len(ids) == 3 and len(set(ids)) == 3
        assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", i) for i in ids), ids

    asyncio.run(run())


@pytest.mark.parametrize("body,headers", [
    ({"stream": True}, {}),
    ({"n": 2}, {}),
    ({}, {"X-Bench-Fault": "http_error"}),
])
def test_bodies_the_fast_path_does_not_take_fall_back(body: dict[str, Any], headers: dict[str, str]) -> None:
    async def run() -> None:
        ctx = load_context("rlvr-500")
        call = Caller(create_app(ctx))
        trajectory = ctx.store.trajectories[0]
        for _ in range(2):
            await call({"model": "m", "messages": trajectory.prompt_messages, **body},
                       {"X-Bench-Trajectory": trajectory.id, **headers})
        assert ctx.chat_replies.hits == ctx.chat_replies.saved == 0
        assert ctx.log.records[-1].trajectory == trajectory.id

    asyncio.run(run())


def test_a_fault_that_fires_takes_the_slow_path_and_is_logged() -> None:
    ids = ["g00000-0", "g00000-1"]

    async def run() -> None:
        ctx = load_context("rlvr-500", plan=plan_from_specs([f"missing_logprobs:trajectories={ids[0]},p=1"], seed=1))
        call = Caller(create_app(ctx))
        for _ in range(2):
            for trajectory_id in ids:
                body = {"model": "m", "messages": ctx.store.by_id[trajectory_id].prompt_messages, "logprobs": True}
                answer = json.loads((await call(body, {"X-Bench-Trajectory": trajectory_id})).body)
                assert (answer["choices"][0]["logprobs"] is None) == (trajectory_id == ids[0])
        assert [e.trajectory for e in ctx.faults.log.events] == [ids[0], ids[0]]
        assert len(ctx.chat_replies) == 1 and ctx.chat_replies.hits == 1  # the faulted requests saved none

    asyncio.run(run())


def test_the_fast_path_answers_as_many_loop_iterations_after_arriving_as_the_slow_path() -> None:
    async def iterations(ctx: ServerContext, call: Caller, body: dict[str, Any], trajectory: str) -> int:
        request = call.request(json.dumps(body).encode(), {"X-Bench-Trajectory": trajectory})
        _, count = await counting_loop_iterations(openai_routes.chat_completions(request))
        return count

    async def run() -> None:
        ctx = load_context("rlvr-500")
        call = Caller(create_app(ctx))
        trajectory = ctx.store.trajectories[0]
        body = {"model": "m", "messages": trajectory.prompt_messages, "logprobs": True}
        counts = {}
        for name, fast in (("slow", False), ("fast (new reply)", True), ("fast (saved)", True), ("slow again", False)):
            ctx.fast_path = fast
            counts[name] = await iterations(ctx, call, body, trajectory.id)
        assert ctx.chat_replies.hits == 1
        assert len(set(counts.values())) == 1, counts

    asyncio.run(run())


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_entry_templates_give_the_formatters_entries_for_every_token(flavor: str) -> None:
    tokenizer = load_tokenizer()
    values = [None, -0.25, float("-inf"), -1e-12, 0, -0.0, -12345.5, 1e-05]
    for options in ({}, {"top_logprobs": 2}, {"tokens_as_ids": True}, {"tokens_as_ids": True, "top_logprobs": 1}):
        request = parse_chat({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, flavor, tokenizer)
        for key, value in options.items():
            setattr(request, key, value)
        formatter = OpenAIFormatter(flavor, request, tokenizer, "m", "x")
        templates = EntryTemplates(formatter)
        for start in range(0, tokenizer.vocab_size, 97):
            entries = [(values[(start + i) % len(values)], token)
                       for i, token in enumerate(range(start, min(start + 97, tokenizer.vocab_size)))]
            got = templates.content(entries)
            assert got == wire.dumps([formatter._chat_entry(t, lp) for lp, t in entries]), (options, start)


def test_over_http_the_fast_answer_has_the_slow_answers_headers() -> None:
    """Through a real server: status, content type and the served headers (trajectory, turn, attempt, request id) the
    worker attributes answers by are the slow path's, body aside from its ids and time."""
    import urllib.request

    from bench.server import ServerThread

    with ServerThread("agentic-500") as server:
        trajectory = server.context.store.trajectories[0]
        body = json.dumps({"model": "m", "messages": trajectory.prompt_messages, "tools": trajectory.prompt_tools,
                           "logprobs": True, "request_id": "client-1"}).encode()
        answers = []
        for fast in (True, True, False):
            server.context.fast_path = fast
            request = urllib.request.Request(server.url + CHAT, data=body, method="POST", headers={
                "Content-Type": "application/json", "X-Bench-Trajectory": trajectory.id})
            with urllib.request.urlopen(request, timeout=30) as reply:
                headers = {k.lower(): v for k, v in reply.headers.items() if k.lower().startswith("x-bench")}
                headers.pop("x-bench-served-attempt", None)  # the attempt counts up: compared below
                answers.append((reply.status, reply.headers.get("Content-Type"), headers, _normal(reply.read())))
        assert answers[0] == answers[1] == answers[2]
        assert answers[0][2], "the answer names what it served"
        assert [r.attempt for r in server.context.log.records[-3:]] == [1, 2, 3]
        assert server.context.chat_replies.hits == 1


def test_the_caches_stay_within_their_bytes() -> None:
    """Saved replies count the parsed body their key keeps alive; parsed bodies count their prompt's ids."""
    from bench.server.openai_fast import ChatReplies

    replies = ChatReplies(limit_bytes=10_000)
    for number in range(50):
        replies.put(("t", number, None), None, held=900)
        assert replies.bytes <= 10_000
    assert len(replies) == 10_000 // 964 and replies.bytes == len(replies) * 964
    tokenizer = load_tokenizer()
    raw = json.dumps({"messages": [{"role": "user", "content": "word " * 3000}]}).encode()
    fast = replies.parse(raw, "vllm", tokenizer, 10**6)
    assert fast.kept and fast.size > 12 * len(fast.ids) and replies.parse(raw, "vllm", tokenizer, 10**6) is fast
    huge = json.dumps({"messages": [{"role": "user", "content": "word " * 30000}]}).encode()
    assert not replies.parse(huge, "vllm", tokenizer, 10**6).kept  # over 1/64 of the budget: parsed every time
    assert replies.parse(huge, "vllm", tokenizer, 10**6) is not replies.parse(huge, "vllm", tokenizer, 10**6)


def test_paced_answers_whole_and_aborted_are_the_slow_paths() -> None:
    """At a time scale where answers take time, a saved reply is played as the slow path plays it: whole, the same
    bytes; aborted while waiting for its first token (the whole server's requests aborted), the slow path's body for
    an aborted answer, built by its formatter."""
    async def answer(ctx: ServerContext, call: Caller, body: dict[str, Any], trajectory: str,
                     abort_after: float | None) -> tuple[Any, ...]:
        task = asyncio.ensure_future(call(body, {"X-Bench-Trajectory": trajectory}))
        if abort_after is not None:
            await asyncio.sleep(abort_after)
            assert ctx.state.abort(abort_all=True) == 1
        response = await task
        return response.status, _normal(response.body), _log_row(ctx, len(ctx.log) - 1)

    async def run() -> None:
        ctx = load_context("rlvr-500", time_scale=0.005)  # 4.4 s of recorded decoding: 22 ms; first tokens ~0.3 ms
        call = Caller(create_app(ctx))
        for trajectory in ctx.store.trajectories[:5]:
            body = {"model": "m", "messages": trajectory.prompt_messages, "logprobs": True, "return_token_ids": True}
            answers = []
            for fast in (True, True, False):
                ctx.fast_path = fast
                answers.append(await answer(ctx, call, body, trajectory.id, None))
            assert answers[0] == answers[1] == answers[2]
        assert ctx.chat_replies.hits == 5
        ctx = load_context("rlvr-500", time_scale=20.0)  # first tokens after about a second
        call = Caller(create_app(ctx))
        trajectory = ctx.store.trajectories[0]
        body = {"model": "m", "messages": trajectory.prompt_messages, "logprobs": True, "return_token_ids": True}
        aborted = []
        for fast in (True, True, False):
            ctx.fast_path = fast
            aborted.append(await answer(ctx, call, body, trajectory.id, 0.05))
        assert ctx.chat_replies.hits == 1
        assert aborted[0] == aborted[1] == aborted[2]
        assert json.loads(aborted[0][1])["choices"][0]["finish_reason"] == "abort"

    asyncio.run(run())
