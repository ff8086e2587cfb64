"""The fast path of `/generate` (bench/server/native_fast.py) answers exactly as the slow path does.

Every recorded turn of a shipped multi-turn trace goes through the real handler twice, once with the fast path and
once without it, under every SGLang profile and every request shape the fast path accepts (logprobs on or off, with
text, from a prompt position, with top logprobs; the recorded sampling parameters and cut or stopped variants): the
answers must be the same bytes but for the per-request fields (`e2e_latency`, `response_sent_to_client_ts`, and `id`
when the server makes one up), and the request log and the served-token store must hold the same. Shapes the fast
path does not take must fall back to the slow path, and fault decisions must be those of `Schedule.fires`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import re
from array import array
from itertools import product
from typing import Any

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from bench.server import PROFILES
from bench.server import native, native_fast
from bench.server.app import create_app, load_context
from bench.server.context import ServerContext
from faults import Target, plan_from_specs, resolve_plan
from faults.engine import CompiledPlan, _bound, _threshold
from tests.server_helpers import ReadingProtocol, counting_loop_iterations

TRACE = "retool-64"  # 64 multi-turn trajectories, 167 turns
VOLATILE = re.compile(rb'"(e2e_latency|response_sent_to_client_ts)":[0-9.e+-]+')
ID = re.compile(rb'"id":"[0-9a-f]{32}"')
# every logprob option the fast path takes, and its defaults given explicitly (they must name the same saved reply)
LOGPROB_SHAPES = [{}, {"return_logprob": False, "top_logprobs_num": 2}] + [
    {"return_logprob": True, **{k: v for k, v in zip(("return_text_in_logprobs", "logprob_start_len",
                                                      "top_logprobs_num"), values) if v is not None}}
    for values in product((None, True), (None, 0, 3), (None, 2))
] + [{"return_logprob": True, "return_text_in_logprobs": False, "logprob_start_len": -1, "top_logprobs_num": 0},
     {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 0, "return_prompt_token_ids": True}]
SHAPES_PER_TURN = 4  # each turn under 4 of the shapes, in rotation: every shape meets ~40 turns per profile
LOG_FIELDS = ("endpoint", "rid", "trajectory", "group", "turn", "drift", "by_order", "stream", "status",
              "prompt_tokens", "completion_tokens", "finish", "client_disconnected", "error", "served_tokens",
              "served_digest", "weight_version", "logprobs_served", "continues")


def _sampling(trajectory: Any, turn: int) -> dict[str, Any]:
    """The recorded parameters, or (turn by turn) a cut, a stop string, stop ids, a request without any."""
    recorded = dict(trajectory.first_sampling_params)
    variant = (trajectory.index + turn) % 5
    if variant == 1:
        return {**recorded, "max_new_tokens": 7}
    if variant == 2:
        return {**recorded, "stop": [" the", "\n\n"], "no_stop_trim": turn % 2 == 0}
    if variant == 3:
        return {"max_new_tokens": 4096, "stop_token_ids": [1758, 13], "ignore_eos": True, "temperature": 0.7}
    if variant == 4:
        return {}
    return recorded


def _ids(trajectory: Any, turn: int) -> list[int]:
    recorded = trajectory.turns[turn]
    return list(array("i", trajectory.sequences[recorded.sequence][: recorded.input_len * 4]))


async def _call(app: web.Application, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
    """The real handler on a real aiohttp request (no socket): what `POST /generate` answers."""
    raw = json.dumps(body).encode()
    protocol = ReadingProtocol()
    payload = StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    payload.feed_data(raw)
    payload.feed_eof()
    request = make_mocked_request("POST", "/generate", headers={"Content-Type": "application/json",
                                                                "Content-Length": str(len(raw)), **headers},
                                  app=app, payload=payload)
    guarded = next(r.handler for r in app.router.routes() if r.method == "POST" and r.resource is not None
                   and r.resource.canonical == "/generate")  # `generate` behind the guard, which names what was served
    return await guarded(request)  # type: ignore[no-any-return]


def _served_headers(answer: web.Response, record: Any, with_rid: bool) -> dict[str, str]:
    """The headers naming what was served, the attempt checked against the log's (each call is an attempt of its own),
    the request id only where the body sent one (else it is made up)."""
    headers = {k: v for k, v in answer.headers.items() if k.startswith("X-Bench-Served-")}
    if headers:
        assert headers.pop("X-Bench-Served-Attempt") == str(record.attempt)
        assert headers["X-Bench-Served-Request-Id"] == record.rid
        if not with_rid:
            del headers["X-Bench-Served-Request-Id"]
    return headers


def _normal(body: bytes, made_up_id: bool) -> bytes:
    body = VOLATILE.sub(lambda m: b'"' + m.group(1) + b'":0', body)
    return ID.sub(b'"id":"-"', body) if made_up_id else body


def _log_row(ctx: ServerContext, index: int, with_rid: bool) -> tuple[Any, ...]:
    record = ctx.log.records[index]
    fields = LOG_FIELDS if with_rid else tuple(f for f in LOG_FIELDS if f != "rid")
    entry = ctx.served.entry_of(record)
    served = None if entry is None else (list(ctx.served.tokens(entry)), [round(v, 9) if v == v else "nan"
                                                                           for v in ctx.served.logprobs_of(entry)],
                                         entry.logprobs_shown, entry.link, entry.context_digest, entry.parent)
    return tuple(getattr(record, f) for f in fields) + (served,)


async def _compare_trace(profile: str) -> tuple[int, int]:
    ctx = load_context(TRACE, sglang_version=profile)
    app = create_app(ctx)
    compared = fast_answers = 0
    for trajectory in ctx.store.trajectories:
        for turn in range(len(trajectory.turns)):
            ids, sampling = _ids(trajectory, turn), _sampling(trajectory, turn)
            for number in range(SHAPES_PER_TURN):
                shape = LOGPROB_SHAPES[(trajectory.index * 3 + turn * SHAPES_PER_TURN + number) % len(LOGPROB_SHAPES)]
                body = {"input_ids": ids, "sampling_params": sampling, **shape}
                with_rid = (number + turn) % 2 == 0
                if with_rid:
                    body["rid"] = f"{trajectory.id}-{turn}-{number}"
                headers = {"X-Bench-Trajectory": trajectory.id}
                answers, rows = [], []
                for fast in (True, False):
                    ctx.fast_path = fast
                    before = ctx.replies.hits + ctx.replies.saved
                    answer = await _call(app, body, headers)
                    if fast:  # a refused turn (context length, a recorded error) is the slow path's to answer
                        took_fast = ctx.replies.hits + ctx.replies.saved > before
                        assert took_fast == (answer.status == 200), (profile, trajectory.id, turn, answer.body[:200])
                        fast_answers += took_fast
                    answers.append((answer.status, answer.content_type, _normal(answer.body, not with_rid),
                                    _served_headers(answer, ctx.log.records[-1], with_rid)))
                    rows.append(_log_row(ctx, len(ctx.log) - 1, with_rid))
                assert answers[0] == answers[1], (profile, trajectory.id, turn, shape)
                assert rows[0] == rows[1], (profile, trajectory.id, turn, shape)
                compared += 1
    return compared, fast_answers


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_fast_answers_are_the_slow_paths_bytes_for_every_turn_and_shape(profile: str) -> None:
    compared, fast = asyncio.run(_compare_trace(profile))
    assert compared == 167 * SHAPES_PER_TURN
    assert fast > compared * 0.7  # most took the fast path (the rest asked for more than the context holds)


def test_the_benchmark_shape_for_every_turn_of_rlvr() -> None:
    """The throughput benchmark's requests (rlvr-500's turn 0, recorded parameters, logprobs on), each answered
    twice by the fast path (the second from the saved reply) and once by the slow path."""
    async def run() -> None:
        ctx = load_context("rlvr-500")
        app = create_app(ctx)
        for trajectory in ctx.store.trajectories:
            body = {"input_ids": _ids(trajectory, 0), "sampling_params": dict(trajectory.first_sampling_params),
                    "return_logprob": True}
            answers = []
            for fast in (True, True, False):
                ctx.fast_path = fast
                answer = await _call(app, body, {"X-Bench-Trajectory": trajectory.id})
                answers.append((answer.status, _normal(answer.body, True)))
            assert answers[0] == answers[1] == answers[2], trajectory.id
        assert len(ctx.replies) == len(ctx.store.trajectories)
        ctx.state.weight_version = "17"  # a weight update: saved replies report the version at their finish
        for trajectory in ctx.store.trajectories[:20]:
            body = {"input_ids": _ids(trajectory, 0), "sampling_params": dict(trajectory.first_sampling_params),
                    "return_logprob": True}
            ctx.fast_path = True
            answer = await _call(app, body, {"X-Bench-Trajectory": trajectory.id})
            assert json.loads(answer.body)["meta_info"]["weight_version"] == "17"
            assert ctx.log.records[-1].weight_version == "17"

    asyncio.run(run())


@pytest.mark.parametrize("body", [
    {"input_ids": [1, 2, 3], "stream": True},
    {"input_ids": [[1, 2, 3], [4, 5]]},
    {"text": "hello"},
    {"input_ids": [1, 2, 3], "sampling_params": {"n": 2}},
    {"input_ids": [1, 2, 3], "rid": ["a"]},
    {"input_ids": [1, True, 3]},
    {"input_ids": [1, 2.0, 3]},
    {"input_ids": [1, 100_000, 3]},  # outside the vocabulary (100,000 ids): checked while decoding
    {"input_ids": [1, -1, 3]},
    {"input_ids": []},
    {"input_ids": [1, 2, 3], "return_logprob": [True]},
    {"input_ids": [1, 2, 3], "logprob_start_len": True},
    {"input_ids": [1, 2, 3], "lora_path": "x"},
    {"input_ids": [1, 2, 3], "sampling_params": {"temperature": -1}},
    {"input_ids": [1, 2, 3], "sampling_params": {"bogus": 1}},
    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": "9"}},
    {"input_ids": [1, 2, 3], "sampling_params": [{}]},
])
def test_shapes_the_fast_path_does_not_take_fall_back(body: dict[str, Any]) -> None:
    profile = PROFILES["0.5.15"]
    assert native_fast.accept(json.dumps(body).encode(), None, profile, native_fast.SamplingCache(), 100_000) is None


def _fields(fast: native_fast.FastRequest | None) -> Any:
    if fast is None:
        return None
    return (fast.ids, fast.hint, fast.sampling, fast.params, fast.shape, fast.key, fast.packed,
            fast.rid if fast.rid.startswith("r") else "made up")


@pytest.mark.parametrize("layout", ["python", "compact"])
def test_a_trajectorys_prompts_parse_from_the_cache_as_from_their_whole_bodies(layout: str) -> None:
    """`PromptCache`: each body, sent after the others of its trajectory in this order, is taken as the whole body's
    decoder takes it (or refused as it refuses it), whether its ids extend the previous request's, repeat them, or
    only look alike."""
    separators = (", ", ": ") if layout == "python" else (",", ":")
    profile, vocab = PROFILES["0.5.23"], 1000
    params = {"max_new_tokens": 3}

    def body(ids: Any, **extra: Any) -> bytes:
        return json.dumps({"input_ids": ids, "sampling_params": params, "return_logprob": True, **extra},
                          separators=separators).encode()

    sent = [
        body([5, 6, 7]),
        body([5, 6, 7]),  # a retry: the same bytes
        body([5, 6, 7, 8, 9], rid="r1"),  # the next turn
        body([5, 6, 7, 8, 9, 10]),
        body([5, 6, 7, 8, 9, 10, 999]),
        body([5, 6, 7, 8, 9, 10, 999, 1000]),  # the new id is outside the vocabulary: refused
        body([5, 6, 7, 8, 9, 10, 9991]),  # 999 and then 1: not an extension at a comma
        body([5, 6, 7, 8, 9, 10, 999]).replace(b"999]", b"999,]"),  # a trailing comma: not JSON
        body([5, 6, 7, 8, 9, 10, 999]).replace(b"999]", b"999, 12.0]"),  # a float: not an id
        body([5, 6, 7, 8, 9, 10, 999]).replace(b"999]", b'999, "a]"]'),  # a string holding the bracket
        body([5, 6, 7, 8, 9, 10, 999]).replace(b"999]", b"999 , 3 ]"),  # spaces where JSON allows them
        body([5, 6, 7, 8, 9, 10, 999], stream=True),
        # a second input_ids key (by hand: a dict holds one): the last one counts, an empty one too
        body([5, 6, 7, 8, 9, 10, 999])[:-1] + b',"input_ids":[1]}',
        body([5, 6, 7, 8, 9, 10, 999])[:-1] + b',"input_ids":[]}',
        body([5, 6, 7, 8, 9, 10, 999])[:-1],  # cut short
        body([5, 6, 7, 8, 9, 10, 999], unknown=1),  # a key SGLang's schema does not take
        body([5, 6, 7, 8, 9, 10, 999], rid=["x]"]),
        body([]),
        body([5, 6, 7, 8, 9, 10, 999, 3, 4]),
        json.dumps({"sampling_params": params, "input_ids": [5, 6, 7, 8, 9, 10, 999, 3, 4, 5]}).encode(),
        body([1, 2]),  # another prompt altogether
        body([1, 2, 3]),
    ]
    prompts = native_fast.PromptCache()
    for raw in sent:
        cached = native_fast.accept(raw, "t1", profile, native_fast.SamplingCache(), vocab, prompts)
        whole = native_fast.accept(raw, "t1", profile, native_fast.SamplingCache(), vocab)
        assert _fields(cached) == _fields(whole), raw
    assert [_fields(native_fast.accept(raw, "t1", profile, native_fast.SamplingCache(), vocab)) is None
            for raw in sent] == [False] * 5 + [True] * 5 + [False, True, False, True] + [True] * 4 + [False] * 4
    # the retry, three extensions, the streamed repeat, and [..., 999, 3, 4] (the bodies between it and [..., 999] were
    # all refused or decoded whole, which leaves the cache as it was) took their ids from the cache
    assert prompts.hits == 6


def test_a_body_taken_before_is_taken_again_from_its_bytes() -> None:
    """`BodyCache`: a body sent again in the same bytes (a group's samples of one prompt, a retry) is the request
    the whole body's decoder makes of it, with the rid it sends (or a fresh one when it sends none) and the hint of
    its own request; a body longer than `LONGEST` is never kept."""
    profile, vocab, bodies = PROFILES["0.5.23"], 1000, native_fast.BodyCache()
    plain = json.dumps({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}).encode()
    with_rid = json.dumps({"input_ids": [5, 6, 7], "rid": "r9", "return_logprob": True}).encode()
    long = json.dumps({"input_ids": [5] * (bodies.LONGEST // 2)}).encode()
    refused = json.dumps({"input_ids": [5, 6, 7], "stream": True}).encode()
    sent = [(plain, "t1"), (plain, "t2"), (plain, None), (with_rid, "t1"), (with_rid, None), (long, "t1"),
            (long, "t2"), (refused, "t1"), (refused, "t1")]
    made_up = set()
    for raw, hint in sent:
        kept = native_fast.accept(raw, hint, profile, native_fast.SamplingCache(), vocab, None, bodies)
        whole = native_fast.accept(raw, hint, profile, native_fast.SamplingCache(), vocab)
        assert _fields(kept) == _fields(whole), (raw, hint)
        if kept is not None and not kept.rid.startswith("r"):
            made_up.add(kept.rid)
    assert len(made_up) == 5  # plain three times, long twice: each request its own
    assert bodies.hits == 3  # plain twice, with_rid once; long is too long and refused is never kept
    assert set(bodies._parsed) == {plain, with_rid}


def test_the_body_cache_stays_within_its_budget() -> None:
    profile, bodies = PROFILES["0.5.23"], native_fast.BodyCache()
    bodies.LIMIT, bodies.LIMIT_BYTES = 4, 1000
    for number in range(40):
        ids = list(range(1, 2 + (number % 7 if number < 20 else number % 3) * 3))  # 7 bodies in turn, then 3
        raw = json.dumps({"input_ids": ids}).encode()
        fast = native_fast.accept(raw, "t", profile, native_fast.SamplingCache(), 1000, None, bodies)
        assert fast is not None and fast.ids == ids
        assert len(bodies._parsed) <= 4 and bodies.bytes <= 1000
        assert bodies.bytes == sum(native_fast._size(raw, kept.packed) for raw, kept in bodies._parsed.items())
    assert bodies.hits > 0


def test_a_groups_samples_of_one_prompt_are_each_their_own_trajectory() -> None:
    """rlvr-500's groups send one prompt from every sample: the same bytes under each sample's trajectory header.
    Each is identified as its own sample (log, served headers) and answered as the slow path answers it."""
    async def run() -> None:
        ctx = load_context("rlvr-500")
        app = create_app(ctx)
        members = [t for t in ctx.store.trajectories if t.group_id == ctx.store.trajectories[0].group_id]
        assert len(members) > 1 and len({tuple(_ids(t, 0)) for t in members}) == 1
        body = {"input_ids": _ids(members[0], 0), "sampling_params": dict(members[0].first_sampling_params),
                "return_logprob": True}
        for fast in (True, False):
            ctx.fast_path = fast
            hits = ctx.replies.bodies.hits
            answers = []
            for member in members:
                answer = await _call(app, body, {"X-Bench-Trajectory": member.id})
                assert answer.status == 200
                assert ctx.log.records[-1].trajectory == member.id
                assert answer.headers["X-Bench-Served-Trajectory"] == member.id
                answers.append(_normal(answer.body, True))
            assert ctx.replies.bodies.hits - hits == (len(members) - 1 if fast else 0)
            if fast:
                fast_answers = answers
        assert fast_answers == answers

    asyncio.run(run())


def test_the_prompt_cache_stays_within_its_budget() -> None:
    profile, prompts = PROFILES["0.5.23"], native_fast.PromptCache()
    prompts.LIMIT, prompts.LIMIT_BYTES = 4, 3000
    for number in range(40):
        raw = json.dumps({"input_ids": list(range(1, 2 + number % 7 * 10))}).encode()
        fast = native_fast.accept(raw, f"t{number % 6}", profile, native_fast.SamplingCache(), 1000, prompts)
        assert fast is not None and fast.ids == list(range(1, 2 + number % 7 * 10))
        assert len(prompts._last) <= 4 and prompts.bytes <= 3000
        assert prompts.bytes == sum(native_fast._size(text, packed) for text, _, packed in prompts._last.values())


def test_accepted_bodies_parse_as_the_slow_path_parses_them() -> None:
    from bench.server.native_request import parse_generate
    from bench.tokenizer import load_tokenizer

    profile, tokenizer = PROFILES["0.5.23"], load_tokenizer()
    for extra in LOGPROB_SHAPES + [{"rid": "r1"}, {"return_prompt_token_ids": True, "stream": False}]:
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "stop": "x"}, **extra}
        fast = native_fast.accept(json.dumps(body).encode(), "hint", profile, native_fast.SamplingCache(), 100_000)
        assert fast is not None, extra
        slow = parse_generate(body, profile, tokenizer, "hint")
        slow.items[0].rid = fast.rid  # made up per request when the body has none
        assert native_fast.native_request(fast) == slow


def test_a_fault_that_fires_takes_the_slow_path_and_is_logged() -> None:
    """With a plan that always fires on one trajectory, its requests are answered (and logged) by the slow path
    even after the fast path saved a reply for the same turn; the others keep the fast path."""
    async def run() -> None:
        ctx = load_context("rlvr-500", plan=plan_from_specs(["missing_logprobs:trajectories=" +
                                                             ctx_ids[0] + ",p=1"], seed=1))
        app = create_app(ctx)
        for trajectory_id in ctx_ids:
            trajectory = ctx.store.by_id[trajectory_id]
            body = {"input_ids": _ids(trajectory, 0), "return_logprob": True,
                    "sampling_params": dict(trajectory.first_sampling_params)}
            answer = await _call(app, body, {"X-Bench-Trajectory": trajectory_id})
            meta = json.loads(answer.body)["meta_info"]
            assert ("output_token_logprobs" in meta) == (trajectory_id != ctx_ids[0])
        assert [e.trajectory for e in ctx.faults.log.events] == [ctx_ids[0]]
        assert len(ctx.replies) == 1  # the faulted request saved none

    ctx_ids = ["g00000-0", "g00000-1"]
    asyncio.run(run())


def test_compiled_decisions_are_the_schedules_own() -> None:
    rules = ["http_error:p=1/3,attempts=1-2", "abort:p=1,turns=0-1", "missing_logprobs:every=3,p=0.5",
             "null_logprob:window=0-5,p=0.9", "nan_logprob:first=2", "stall:groups=g1,p=0.7",
             "latency:endpoints=/generate,p=1/7", "http_error:p=1", "missing_weight_version:trajectories=t3"]
    for plan in (resolve_plan("chaos"), plan_from_specs(rules, seed=11)):
        compiled = CompiledPlan(plan)
        rng = random.Random(0)
        for _ in range(20000):
            target = Target(f"t{rng.randrange(50)}", rng.choice([None, rng.randrange(50)]),
                            rng.choice([None, "g1", "g2"]), rng.randrange(4), rng.randrange(1, 6),
                            rng.choice(["/generate", "/v1/chat/completions"]))
            elapsed = rng.uniform(0, 10)
            expected = tuple(r for r in plan.rules if r.fault.server_side and not r.fault.on_weight_update
                             and r.schedule.fires(plan.seed, r.name, target, elapsed))
            assert compiled.fired(target, elapsed) == expected


def test_probability_thresholds_are_exact() -> None:
    rng = random.Random(5)
    for p in [1.0, 0.5, 1 / 3, 1 / 150, 1e-9, 0.999999] + [rng.random() for _ in range(200)]:
        threshold = _threshold(p)
        assert threshold == 2**64 or threshold / 2**64 >= p
        assert threshold == 0 or (threshold - 1) / 2**64 < p


def test_digests_compare_with_the_bound_bytes_as_with_the_integer_threshold() -> None:
    """Compiled decisions compare a rule's 8-byte digest with its bound as bytes: the same answer as the integer."""
    rng = random.Random(9)
    edges = [0, 1, 2**63, 2**64 - 1, 2**64]
    digests = [bytes(8), b"\xff" * 8, (2**63).to_bytes(8, "big")] + [rng.randbytes(8) for _ in range(2000)]
    for threshold in edges + [rng.randrange(2**64) for _ in range(200)]:
        bound = _bound(threshold)
        for digest in digests[:3] + rng.sample(digests, 50) + [max(0, threshold - 1).to_bytes(8, "big"),
                                                               min(threshold, 2**64 - 1).to_bytes(8, "big")]:
            assert (digest < bound) == (int.from_bytes(digest, "big") < threshold), (threshold, digest)


WAITS = 200


def _garbage_after(waiter: Any) -> list[Any]:
    """What the cyclic collector finds after `WAITS` waits of 4 loop iterations through `waiter` in a fresh
    `asyncio.run` (kept with DEBUG_SAVEALL, so it can be looked at)."""
    import gc

    async def waits() -> None:
        for _ in range(WAITS):
            await waiter(4)

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        asyncio.run(waits())
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def _bare_waits(count: int) -> None:
    """The baseline: the same iterations as plain task steps, no bench code (what asyncio itself leaves)."""
    for _ in range(count - 1):
        await asyncio.sleep(0)


def _closure_waits(count: int) -> asyncio.Future[None]:
    """The wait as it was written first: a closure calling itself, a cycle (the function, its own cell) per wait."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def hop(left: int) -> None:
        if left:
            loop.call_soon(hop, left - 1)
        elif not future.done():
            future.set_result(None)
    loop.call_soon(hop, count - 2)
    return future


def _functions_of(garbage: list[Any], path: str) -> list[str]:
    """The functions defined in file `path` among `garbage`: a cycle that code made."""
    return [obj.__qualname__ for obj in garbage if inspect.isfunction(obj) and obj.__code__.co_filename == path]


def test_waiting_loop_iterations_leaves_no_cycle_for_the_collector() -> None:
    """The fast path waits `_SLOW_PATH_HOPS` loop iterations per request: that wait must leave nothing for the cyclic
    collector (a self-referencing closure did, two thousand futures and closures alive at a young collection in a
    run), and still take its iterations. Judged against a baseline of plain task steps in the same process, so
    what asyncio.run itself leaves cancels out, and by what the garbage is: no function of the bench's in it."""
    from bench.server.native import _iterations_later

    async def ordered() -> list[int]:
        order: list[int] = []
        loop = asyncio.get_running_loop()
        for _ in range(100):
            loop.call_soon(order.append, 1)
            loop.call_soon(lambda: loop.call_soon(lambda: loop.call_soon(order.append, 3)))
            await _iterations_later(4)
            order.append(4)  # after three iterations of callbacks: the wait is four iterations long
        return order

    assert asyncio.run(ordered()) == [1, 3, 4] * 100
    baseline = len(_garbage_after(_bare_waits))
    closure = _garbage_after(_closure_waits)  # the check sees a cycle per wait where there is one
    assert _functions_of(closure, __file__).count("_closure_waits.<locals>.hop") == WAITS
    assert len(closure) - baseline >= 3 * WAITS  # the function, its cell, the future: per wait
    fast = _garbage_after(_iterations_later)
    assert _functions_of(fast, native.__file__) == []
    assert len(fast) - baseline < WAITS // 10, [type(obj).__name__ for obj in fast]  # nothing per wait


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_handler_that_fails_after_identifying_answers_aiohttps_500_naming_what_was_served(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a generation route after its request was identified: aiohttp's own 500 (made by the guard, where
    the served headers can still be added) names the trajectory, turn, attempt and request id, and the log says
    what failed."""
    import urllib.error
    import urllib.request

    from bench.server import ServerThread

    async def slow_bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected bug after identification")

    def fast_bug(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("injected bug after identification")

    if path == "slow":
        monkeypatch.setattr(native, "_run_whole", slow_bug)
    else:
        monkeypatch.setattr(native, "played_at_once", fast_bug)
    with ServerThread("retool-64") as server:
        server.context.fast_path = path == "fast"
        trajectory = server.context.store.trajectories[0]
        body = json.dumps({"input_ids": _ids(trajectory, 0), "rid": "r1",
                           "sampling_params": dict(trajectory.first_sampling_params)}).encode()
        request = urllib.request.Request(server.url + "/generate", data=body, headers={
            "Content-Type": "application/json", "X-Bench-Trajectory": trajectory.id})
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=30)
        headers = {k: v for k, v in failed.value.headers.items() if k.startswith("X-Bench-Served-")}
        assert failed.value.code == 500 and b"Internal Server Error" in failed.value.read()
        assert headers == {"X-Bench-Served-Trajectory": trajectory.id, "X-Bench-Served-Turn": "0",
                           "X-Bench-Served-Attempt": "1", "X-Bench-Served-Request-Id": "r1"}
        assert server.context.log.records[-1].error == "RuntimeError: injected bug after identification"


@pytest.mark.parametrize("shape", ["streamed", "spliced after a fault", "saved reply", "slow path"])
def test_every_generation_answer_names_what_it_served(shape: str) -> None:
    """The served headers (trajectory, turn, attempt, request id) on a stream a generation route opens (`served.prepare`),
    on an answer a fault left spliceable (`_faulted_splice`), on the saved reply and on the slow path's answer."""
    import urllib.request

    from bench.server import ServerThread

    plan = plan_from_specs(["stale_weight_version:p=1"], seed=1) if shape == "spliced after a fault" else None
    with ServerThread("retool-64", plan=plan) as server:
        server.context.fast_path = shape != "slow path"
        trajectory = server.context.store.trajectories[0]
        body = {"input_ids": _ids(trajectory, 0), "rid": "r1", "return_logprob": True,
                "sampling_params": dict(trajectory.first_sampling_params), "stream": shape == "streamed"}
        for attempt in (1, 2):  # the first saves the reply the second is spliced from
            body["rid"] = f"r{attempt}"
            request = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(), headers={
                "Content-Type": "application/json", "X-Bench-Trajectory": trajectory.id})
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()
                headers = {k: v for k, v in answer.headers.items() if k.startswith("X-Bench-Served-")}
            assert headers == {"X-Bench-Served-Trajectory": trajectory.id, "X-Bench-Served-Turn": "0",
                               "X-Bench-Served-Attempt": str(attempt), "X-Bench-Served-Request-Id": f"r{attempt}"}
        if shape == "spliced after a fault":
            assert len(server.context.faults.log.events) == 2


def test_the_fast_path_answers_as_many_loop_iterations_after_arriving_as_the_slow_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A generation is answered the slow path's 4 loop iterations after its request arrived, on every path (the saved
    reply, a new one, an answer spliced after a fault); an error that replaces it is answered at once, so a rollout
    sees an error before the generations sent with it, as from a real engine."""
    async def iterations(app: web.Application, body: dict[str, Any], trajectory: str) -> tuple[int, int]:
        answer, count = await counting_loop_iterations(_call(app, body, {"X-Bench-Trajectory": trajectory}))
        return answer.status, count

    spliced = []
    splice = native._faulted_splice

    async def counted(*args: Any, **kwargs: Any) -> Any:
        spliced.append(1)
        return await splice(*args, **kwargs)

    monkeypatch.setattr(native, "_faulted_splice", counted)

    async def run() -> None:
        ctx = load_context("rlvr-500", plan=plan_from_specs(["stale_weight_version:attempts=4",
                                                             "http_error:status=500,attempts=5"], seed=1))
        app = create_app(ctx)
        trajectory = ctx.store.trajectories[0]
        body = {"input_ids": _ids(trajectory, 0), "return_logprob": True,
                "sampling_params": dict(trajectory.first_sampling_params)}
        counts = []
        for fast in (False, True, True, True, True):  # slow; a new reply; the saved one; spliced; the error
            ctx.fast_path = fast
            counts.append(await iterations(app, body, trajectory.id))
        assert ctx.replies.hits >= 1 and [e.fault for e in ctx.faults.log.events] == ["stale_weight_version",
                                                                                       "http_error"]
        assert counts[:4] == [(200, counts[0][1])] * 4, counts
        assert counts[4][0] == 500 and counts[4][1] < counts[0][1], counts

    asyncio.run(run())
    assert spliced == [1]
