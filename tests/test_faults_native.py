"""Every server-side fault on SGLang's native `/generate`, forced with `X-Bench-Fault`.

For each fault: the bytes on the wire against what the real SGLang / sglang-router stack
emits (WIRE.md 1, 4.4, 6), what a plain aiohttp client (AReaL, verl) makes of them, and
exactly one fault-log event naming the trajectory, turn, attempt and request id it hit.
Bytes are read off a raw socket, so partial bodies, missing chunked terminators and resets
are seen as they are.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import urlsplit

import aiohttp
import pytest

import faults.catalogue  # noqa: F401  (registers every fault)
from bench import raise_if_poisoned
from bench.replay.store import RecordedTrajectory
from bench.server import BenchServer, ServerThread
from faults import FAULTS, plan_from_specs
from faults.hooks import POISON_MARKER, InjectedFault
from tests.server_helpers import request, turn_input

EOS = 1758
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORTED_BYTES = b'"finish_reason":{"type":"abort","message":"Aborted","status_code":null,"err_type":null}'
NO_WORKERS = b"No available workers (all circuits open or unhealthy)"
ROUTER_503 = b'{"error":{"type":"Service Unavailable","code":"no_available_workers","message":"' + NO_WORKERS + b'"}}'
TIMEOUT_503 = b'{"object":"error","message":"Request running timeout reached.","type":"503","param":null,"code":503}'
# WIRE.md 1.6: a queued abort in 0.5.15 (logprobs requested)
QUEUED_META = ["id", "finish_reason", "weight_version", "e2e_latency", "input_token_logprobs", "output_token_logprobs",
               "output_token_logprobs_length", "completion_tokens", "response_sent_to_client_ts"]
LOGPROB_KEYS = {"input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"}

# Faults whose native behaviour this file checks; `test_every_native_fault_is_covered` keeps it honest.
COVERED = {
    "abort", "abort_all_on_weight_update", "connection_reset", "context_length_error", "empty_completion",
    "http_error", "latency", "logprob_length_mismatch", "malformed_json", "missing_logprobs",
    "missing_weight_version", "nan_logprob", "null_logprob", "outage", "oversized_tool_output",
    "raise_after_generate", "router_no_workers", "slow_first_token", "stale_weight_version", "stall", "stream_cut",
    "stream_no_finish_reason", "truncated_body", "wrong_content_type", "zero_length",
}
NOT_NATIVE_SERVER = {"stale_retry", "text_without_ids", "hold_weights"}  # client-side / OpenAI-only / step boundaries


# -- raw HTTP ------------------------------------------------------------------------------------------------------
@dataclass
class Raw:
    """One exchange as bytes: status line and headers, the (de-chunked) body, and how it ended."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    complete: bool  # content-length satisfied or the chunked terminator seen
    chunked: bool
    reset: bool  # the peer reset the connection
    timed_out: bool
    first_byte_after: float | None
    first_event_after: float | None
    elapsed: float
    trajectory: RecordedTrajectory | None = None
    rid: str = ""
    tail: bytes = b""  # bytes after the last complete SSE event

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[bytes]:
        """Complete SSE payloads (`data: ` stripped); framing must be `data: ...\\n\\n` throughout."""
        parts = self.body.split(b"\n\n")
        self.tail = parts.pop()
        assert all(p.startswith(b"data: ") for p in parts), parts[:3]
        return [p[len(b"data: "):] for p in parts]

    def items(self) -> list[dict[str, Any]]:
        """The JSON events before `[DONE]` (asserting `[DONE]` comes last if at all)."""
        events = self.events()
        if b"[DONE]" in events:
            assert events.index(b"[DONE]") == len(events) - 1
            events = events[:-1]
        return [json.loads(e) for e in events]


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    out, rest = bytearray(), data
    while True:
        line, sep, after = rest.partition(b"\r\n")
        if not sep:
            return bytes(out), False
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return bytes(out), after.startswith(b"\r\n")
        out += after[:size]
        if len(after) < size + 2:
            return bytes(out), False
        rest = after[size + 2:]


def raw_post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 20) -> Raw:
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    received = bytearray()
    reset = timed_out = False
    first_byte = first_event = None
    started = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head + data)
        while True:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                reset = True
                break
            except socket.timeout:
                timed_out = True
                break
            if not piece:
                break
            now = time.monotonic() - started
            first_byte = first_byte if first_byte is not None else now
            received += piece
            if first_event is None and b"data: " in received:
                first_event = now
    elapsed = time.monotonic() - started
    raw = bytes(received)
    if not raw:
        return Raw(None, {}, b"", False, False, reset or not timed_out, timed_out, None, None, elapsed)
    header_block, _, payload = raw.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    heads = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        heads[name.strip().lower()] = value.strip()
    chunked = heads.get("transfer-encoding") == "chunked"
    if chunked:
        payload, complete = _dechunk(payload)
    else:
        complete = len(payload) == int(heads.get("content-length", len(payload)))
    return Raw(status, heads, payload, complete, chunked, reset, timed_out, first_byte, first_event, elapsed)


# -- server and requests -------------------------------------------------------------------------------------------
@dataclass
class Bench:
    thread: ServerThread
    unused: Iterator[RecordedTrajectory] = field(init=False)

    def __post_init__(self) -> None:
        self.unused = iter(self.thread.context.store.trajectories)

    @property
    def url(self) -> str:
        return self.thread.url

    def fresh(self) -> RecordedTrajectory:
        """A trajectory no test has sent yet, so its turn 0 is attempt 1."""
        return next(self.unused)


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    with ServerThread("rlvr-500") as thread:
        yield Bench(thread)


def _body(trajectory: RecordedTrajectory, rid: str, stream: bool, **extra: Any) -> dict[str, Any]:
    return {"input_ids": turn_input(trajectory, 0), "rid": rid, "stream": stream,
            "sampling_params": {"max_new_tokens": 1024, "stop_token_ids": [EOS], "no_stop_trim": True},
            "return_logprob": True, **extra}


def _headers(trajectory: RecordedTrajectory, spec: str) -> dict[str, str]:
    return {"X-Bench-Trajectory": trajectory.id, "X-Bench-Fault": spec}


def assert_one_event(server: ServerThread, spec: str, trajectory: RecordedTrajectory, rid: str,
                     attempt: int = 1) -> None:
    """The forced fault fired exactly once, for this attempt of this trajectory's turn 0, under this rid."""
    fault = spec.split(":")[0]
    mine = [e for e in server.context.faults.log.events if e.trajectory == trajectory.id]
    assert len(mine) == 1, mine
    event = mine[0]
    assert (event.rule, event.fault, event.group, event.turn, event.attempt, event.endpoint, event.request_id) == (
        f"header:{fault}#0", fault, trajectory.group_id, 0, attempt, "/generate", rid)
    assert event.change


def send(bench: Bench, spec: str, *, stream: bool, timeout: float = 20, trajectory: RecordedTrajectory | None = None,
         **extra: Any) -> Raw:
    """Force `spec` on a fresh trajectory's turn 0; check the fault log; return the raw exchange."""
    trajectory, rid = trajectory or bench.fresh(), uuid.uuid4().hex
    raw = raw_post(bench.url, _body(trajectory, rid, stream, **extra), _headers(trajectory, spec), timeout)
    raw.trajectory, raw.rid = trajectory, rid
    if not raw.timed_out:  # a stalled request logs its event before it stalls; checked there
        assert_one_event(bench.thread, spec, trajectory, rid)
    return raw


@dataclass
class Seen:
    """What a plain aiohttp client got: `resp.json()` (or its stream's JSON events) or an exception."""

    status: int | None = None
    value: Any = None
    error: BaseException | None = None
    done: bool = False  # stream: `data: [DONE]` arrived


def client(bench: Bench, spec: str, *, stream: bool, timeout: float = 20, **extra: Any) -> Seen:
    """The common client code: `await resp.json()`, or reading `data:` lines and `json.loads` each."""
    trajectory, rid = bench.fresh(), uuid.uuid4().hex

    async def run() -> Seen:
        seen = Seen()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            try:
                async with http.post(f"{bench.url}/generate", json=_body(trajectory, rid, stream, **extra),
                                     headers=_headers(trajectory, spec)) as resp:
                    seen.status = resp.status
                    if not stream:
                        seen.value = await resp.json()
                        return seen
                    seen.value = []
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            payload = line[len(b"data: "):].strip()
                            if payload == b"[DONE]":
                                seen.done = True
                                break
                            seen.value.append(json.loads(payload))
            except (aiohttp.ClientError, ValueError, TimeoutError) as error:
                seen.error = error
        return seen

    seen = asyncio.run(run())
    if not isinstance(seen.error, TimeoutError):
        assert_one_event(bench.thread, spec, trajectory, rid)
    return seen


def _recorded(raw: Raw) -> Any:
    assert raw.trajectory is not None
    return raw.trajectory.turns[0]


def _final(raw: Raw) -> dict[str, Any]:
    """The whole answer: the body, or the last event of a stream that ended with `[DONE]`."""
    if raw.chunked:
        assert raw.headers["content-type"] == "text/event-stream" and raw.complete
        events = raw.events()
        assert events[-1] == b"[DONE]"
        return json.loads(events[-2])
    assert raw.status == 200 and raw.headers["content-type"] == "application/json" and raw.complete
    return raw.json()


STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])


# -- the catalogue ---------------------------------------------------------------------------------------------------
def test_every_native_fault_is_covered() -> None:
    native = {name for name, cls in FAULTS.items() if "native" in cls.apis and cls.server_side}
    assert native | NOT_NATIVE_SERVER == set(FAULTS)
    assert native == COVERED
    assert "native" not in FAULTS["text_without_ids"].apis and not FAULTS["stale_retry"].server_side


def test_unknown_fault_in_the_header_is_a_400_listing_the_faults(bench: Bench) -> None:
    before = len(bench.thread.context.faults.log)
    trajectory = bench.fresh()
    for spec, expected in [("no_such_fault", "unknown fault 'no_such_fault'; valid faults: "),
                           ("http_error:colour=red", "http_error: unknown parameter 'colour'; valid parameters: "),
                           ("abort:p=1/2", "a forced fault takes no schedule (p)")]:
        reply = request(bench.url, "/generate", _body(trajectory, uuid.uuid4().hex, False),
                        headers=_headers(trajectory, spec))
        assert reply.status == 400 and reply.headers["content-type"] == "application/json"
        message = reply.json()["error"]["message"]
        assert expected in message
        if spec == "no_such_fault":
            listed = message.split("valid faults: ", 1)[1].split(", ")
            assert listed == sorted(FAULTS)
        if spec.startswith("http_error"):
            assert message.endswith("valid parameters: status, retry_after")
    assert len(bench.thread.context.faults.log) == before


def test_retries_are_new_attempts_and_several_faults_log_one_event_each(bench: Bench) -> None:
    trajectory = bench.fresh()
    rids = []
    for _ in range(2):
        rid = uuid.uuid4().hex
        rids.append(rid)
        raw = raw_post(bench.url, _body(trajectory, rid, False),
                       _headers(trajectory, "missing_logprobs; stale_weight_version:behind=1"))
        meta = raw.json()["meta_info"]
        assert not LOGPROB_KEYS & set(meta) and meta["weight_version"] == "default-stale1"
    events = [e for e in bench.thread.context.faults.log.events if e.trajectory == trajectory.id]
    assert [(e.rule, e.attempt, e.request_id) for e in events] == [
        ("header:missing_logprobs#0", 1, rids[0]), ("header:stale_weight_version#1", 1, rids[0]),
        ("header:missing_logprobs#0", 2, rids[1]), ("header:stale_weight_version#1", 2, rids[1])]


# -- RL protocol faults ----------------------------------------------------------------------------------------------
@STREAM
def test_missing_logprobs(bench: Bench, stream: bool) -> None:
    raw = send(bench, "missing_logprobs", stream=stream)
    recorded = _recorded(raw)
    items = raw.items() if stream else [raw.json()]
    assert len(items) == (len(recorded.output_ids) if stream else 1)
    for item in items:
        assert not LOGPROB_KEYS & set(item["meta_info"])  # although return_logprob was true
    final = _final(raw)
    assert final["output_ids"] == list(recorded.output_ids)
    assert final["meta_info"]["completion_tokens"] == len(recorded.output_ids)
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    seen = client(bench, "missing_logprobs", stream=stream)
    assert seen.error is None and seen.status == 200
    meta = (seen.value[-1] if stream else seen.value)["meta_info"]
    with pytest.raises(KeyError):
        meta["output_token_logprobs"]  # verl / AReaL index it


@STREAM
@pytest.mark.parametrize("delta", [-1, 2])
def test_logprob_length_mismatch(bench: Bench, stream: bool, delta: int) -> None:
    raw = send(bench, f"logprob_length_mismatch:delta={delta}", stream=stream)
    ids = list(_recorded(raw).output_ids)
    meta = _final(raw)["meta_info"]
    triples = meta["output_token_logprobs"]
    assert meta["completion_tokens"] == len(ids) and _final(raw)["output_ids"] == ids
    assert len(triples) == len(ids) + delta != meta["completion_tokens"]
    assert meta["output_token_logprobs_length"] == len(triples)
    assert all(len(t) == 3 for t in triples)
    if delta < 0:
        assert [t[1] for t in triples] == ids[:delta]
    else:
        assert [t[1] for t in triples[:len(ids)]] == ids and [t[1] for t in triples[len(ids):]] == [ids[-1]] * delta


@STREAM
def test_null_logprob(bench: Bench, stream: bool) -> None:
    raw = send(bench, "null_logprob", stream=stream)
    recorded = _recorded(raw)
    items = raw.items() if stream else [raw.json()]
    for item in items:  # every cumulative chunk shows it
        assert item["meta_info"]["output_token_logprobs"][0] == [None, recorded.output_ids[0], None]
    triples = _final(raw)["meta_info"]["output_token_logprobs"]
    assert b'"output_token_logprobs":[[null,' in (raw.events()[-2] if stream else raw.body)
    assert [t[0] for t in triples[1:]] == list(recorded.logprobs[1:])
    seen = client(bench, "null_logprob:position=3", stream=stream)
    triples = (seen.value[-1] if stream else seen.value)["meta_info"]["output_token_logprobs"]
    assert triples[3][0] is None and all(t[0] is not None for i, t in enumerate(triples) if i != 3)
    with pytest.raises(TypeError):
        sum(t[0] for t in triples)  # open-instruct's running sum


@STREAM
def test_nan_logprob(bench: Bench, stream: bool) -> None:
    raw = send(bench, "nan_logprob", stream=stream)
    recorded = _recorded(raw)
    body = raw.events()[-2] if stream else raw.body
    assert f'"output_token_logprobs":[[NaN,{recorded.output_ids[0]},null]'.encode() in body
    assert body.count(b"NaN") == 1

    def strict(constant: str) -> float:
        raise ValueError(f"not JSON: {constant}")

    with pytest.raises(ValueError, match="not JSON: NaN"):
        json.loads(body, parse_constant=strict)  # a strict parser (orjson, Rust serde) refuses it
    seen = client(bench, "nan_logprob", stream=stream)  # Python's json takes it: a silent NaN
    assert seen.error is None
    triples = (seen.value[-1] if stream else seen.value)["meta_info"]["output_token_logprobs"]
    assert math.isnan(triples[0][0]) and not any(math.isnan(t[0]) for t in triples[1:])


@STREAM
def test_abort_running(bench: Bench, stream: bool) -> None:
    raw = send(bench, "abort", stream=stream)
    recorded = _recorded(raw)
    kept = len(recorded.output_ids) // 2
    assert 0 < kept < len(recorded.output_ids)
    final = _final(raw)
    body = raw.events()[-2] if stream else raw.body
    assert ABORTED_BYTES in body
    meta = final["meta_info"]
    assert meta["finish_reason"] == ABORTED and meta["completion_tokens"] == kept
    assert [t[1] for t in meta["output_token_logprobs"]] == list(recorded.output_ids[:kept])
    assert [t[0] for t in meta["output_token_logprobs"]] == list(recorded.logprobs[:kept])
    if stream:
        items = raw.items()
        assert len(items) == kept and all(i["meta_info"]["finish_reason"] is None for i in items[:-1])
        assert final["output_ids"] == [recorded.output_ids[kept - 1]]  # sglang#34488: only the last id
        assert items[-2]["output_ids"] == list(recorded.output_ids[:kept - 1])
    else:
        assert final["output_ids"] == list(recorded.output_ids[:kept])
    assert recorded.text.startswith(final["text"]) and len(final["text"]) < len(recorded.text)
    seen = client(bench, "abort:keep=0.25", stream=stream)
    final = seen.value[-1] if stream else seen.value
    assert seen.error is None and final["meta_info"]["finish_reason"]["type"] == "abort"


@STREAM
def test_abort_queued_has_the_reduced_0_5_15_shape(bench: Bench, stream: bool) -> None:
    raw = send(bench, "abort:mode=queued", stream=stream)
    if stream:
        assert len(raw.items()) == 1
    item = _final(raw)
    assert list(item) == ["text", "output_ids", "meta_info"] and item["text"] == "" and item["output_ids"] == []
    meta = item["meta_info"]
    assert list(meta) == QUEUED_META
    assert meta["id"] == raw.rid
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert meta["weight_version"] == "default" and meta["completion_tokens"] == 0
    assert meta["input_token_logprobs"] == meta["output_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 0
    seen = client(bench, "abort:mode=queued", stream=stream)
    meta = (seen.value[-1] if stream else seen.value)["meta_info"]
    with pytest.raises(KeyError):
        meta["prompt_tokens"]


@STREAM
@pytest.mark.parametrize("spec, finish", [("zero_length", {"type": "length", "length": 0}),
                                          ("empty_completion", {"type": "stop", "matched": EOS})])
def test_zero_token_answers(bench: Bench, stream: bool, spec: str, finish: dict[str, Any]) -> None:
    raw = send(bench, spec, stream=stream)
    if stream:
        assert len(raw.items()) == 1
    item = _final(raw)
    finish_bytes = json.dumps(finish, separators=(",", ":")).encode()
    assert b'"finish_reason":' + finish_bytes in (raw.events()[0] if stream else raw.body)
    assert item["text"] == "" and item["output_ids"] == []
    meta = item["meta_info"]
    assert meta["finish_reason"] == finish and meta["completion_tokens"] == 0
    assert meta["output_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 0
    assert meta["prompt_tokens"] == _recorded(raw).input_len and "e2e_latency" in meta
    seen = client(bench, spec, stream=stream)
    assert seen.error is None and (seen.value[-1] if stream else seen.value)["meta_info"]["finish_reason"] == finish


@STREAM
def test_oversized_tool_output_runs_to_exactly_n_bytes(bench: Bench, stream: bool) -> None:
    size = 12_345
    raw = send(bench, f"oversized_tool_output:bytes={size}", stream=stream)
    final = _final(raw)
    text, meta = final["text"], final["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert final["output_ids"][-1] == EOS and meta["completion_tokens"] == len(final["output_ids"])
    assert [t[1] for t in meta["output_token_logprobs"]] == final["output_ids"]
    assert bench.thread.context.tokenizer.decode(final["output_ids"], skip_special_tokens=True) == text
    call = re.fullmatch(r"(?s).*<tool_call>\n(.*)\n</tool_call>", text)
    assert call is not None, text
    tool = json.loads(call.group(1))
    assert tool["name"] == "bash" and set(tool["arguments"]) == {"command"}
    output = subprocess.run(["bash", "-c", tool["arguments"]["command"]], capture_output=True, check=True,
                            timeout=30).stdout
    assert len(output) == size
    assert len(output) > bench.thread.context.config.context_length  # one byte is at least a token's worth


@pytest.mark.parametrize("spec", ["oversized_tool_output:bytes=60000", "raise_after_generate"])
def test_a_replaced_answer_keeps_to_the_requests_max_new_tokens(bench: Bench, spec: str) -> None:
    """A model never says more than it was allowed: a fault's replacement output longer than `max_new_tokens`
    is cut there with finish `length` (an engine stops it), and the fault log says so."""
    limit = 5
    raw = send(bench, spec, stream=False, sampling_params={"max_new_tokens": limit, "stop_token_ids": [EOS]})
    final = _final(raw)
    assert len(final["output_ids"]) == limit == final["meta_info"]["completion_tokens"]
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": limit}
    assert len(final["meta_info"]["output_token_logprobs"]) == limit
    (event,) = [e for e in bench.thread.context.faults.log.events if e.trajectory == raw.trajectory.id]
    assert f"cut at the request's max_new_tokens {limit} of" in event.change


@STREAM
def test_raise_after_generate_poisons_a_valid_reply(bench: Bench, stream: bool) -> None:
    raw = send(bench, "raise_after_generate", stream=stream)
    recorded = _recorded(raw)
    final = _final(raw)
    text, meta = final["text"], final["meta_info"]
    assert text.startswith(recorded.text) and POISON_MARKER in text
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert meta["completion_tokens"] == len(final["output_ids"]) == len(meta["output_token_logprobs"])
    assert [t[1] for t in meta["output_token_logprobs"]] == final["output_ids"]
    assert all(isinstance(t[0], float) and t[0] < 0 for t in meta["output_token_logprobs"])
    raise_if_poisoned(recorded.text)  # the recording itself is harmless
    with pytest.raises(InjectedFault):
        raise_if_poisoned(text)


@pytest.fixture(scope="module")
def versioned() -> Iterator[Bench]:
    """A server whose weight version was bumped to "5"."""
    with ServerThread("rlvr-500") as thread:
        reply = request(thread.url, "/update_weight_version", {"new_version": "5"})
        assert reply.json() == {"success": True, "message": "Weight version updated to 5", "new_version": "5"}
        yield Bench(thread)


@STREAM
def test_stale_weight_version(versioned: Bench, stream: bool) -> None:
    plain = raw_post(versioned.url, _body(versioned.fresh(), uuid.uuid4().hex, stream), {})
    assert _final(plain)["meta_info"]["weight_version"] == "5"
    raw = send(versioned, "stale_weight_version:behind=2", stream=stream)
    items = raw.items() if stream else [raw.json()]
    assert {i["meta_info"]["weight_version"] for i in items} == {"3"}
    assert _final(raw)["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert _final(send(versioned, "stale_weight_version", stream=stream))["meta_info"]["weight_version"] == "4"


@STREAM
def test_missing_weight_version(versioned: Bench, stream: bool) -> None:
    raw = send(versioned, "missing_weight_version", stream=stream)
    items = raw.items() if stream else [raw.json()]
    assert all("weight_version" not in i["meta_info"] for i in items)
    meta = _final(raw)["meta_info"]
    assert list(meta)[:4] == ["id", "finish_reason", "prompt_tokens", "num_retractions"]
    seen = client(versioned, "missing_weight_version", stream=stream)
    with pytest.raises(KeyError):
        (seen.value[-1] if stream else seen.value)["meta_info"]["weight_version"]  # slime#1514


def test_abort_all_on_weight_update() -> None:
    """A weight update sent with abort_all_requests:false still aborts everything in flight (miles#2372)."""
    plan = plan_from_specs(["abort_all_on_weight_update"], seed=3)

    def cost(trajectory: RecordedTrajectory) -> float:  # quickest to its first token, then to its second
        turn = trajectory.turns[0]
        return turn.ttft + 2 * (turn.total - turn.ttft) / len(turn.output_ids)

    async def run() -> None:
        async with BenchServer("rlvr-500", time_scale=100, plan=plan) as server:
            ctx = server.context
            streamed, whole = sorted(ctx.store.trajectories, key=cost)[:2]
            rids = {streamed.id: uuid.uuid4().hex, whole.id: uuid.uuid4().hex}
            first_event = asyncio.Event()
            async with aiohttp.ClientSession() as http:
                async def stream() -> list[bytes]:
                    async with http.post(f"{server.url}/generate", json=_body(streamed, rids[streamed.id], True),
                                         headers={"X-Bench-Trajectory": streamed.id}) as resp:
                        events = []
                        async for line in resp.content:
                            if line.startswith(b"data: "):
                                events.append(line[len(b"data: "):].strip())
                                first_event.set()
                        return events

                async def generate() -> dict[str, Any]:
                    async with http.post(f"{server.url}/generate", json=_body(whole, rids[whole.id], False),
                                         headers={"X-Bench-Trajectory": whole.id}) as resp:
                        assert resp.status == 200
                        return await resp.json()

                tasks = asyncio.ensure_future(stream()), asyncio.ensure_future(generate())
                await asyncio.wait_for(first_event.wait(), 20)  # the stream's first token is out
                assert set(ctx.state.inflight) == set(rids.values()) and not any(t.done() for t in tasks)
                async with http.post(f"{server.url}/update_weights_from_disk",
                                     json={"model_path": "/ckpt/step-2", "abort_all_requests": False}) as resp:
                    assert resp.status == 200 and (await resp.json())["success"] is True
                events, item = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert events[-1] == b"[DONE]"
        final = json.loads(events[-2])
        meta, recorded = final["meta_info"], streamed.turns[0]
        assert meta["finish_reason"] == ABORTED  # running: "Aborted" with the tokens so far
        count = meta["completion_tokens"]
        assert 0 < count < len(recorded.output_ids) and len(events) == count + 2
        assert [t[1] for t in meta["output_token_logprobs"]] == list(recorded.output_ids[:count])
        assert final["output_ids"] == [recorded.output_ids[count - 1]]
        assert item["meta_info"]["finish_reason"]["type"] == "abort"  # running or still queued
        assert item["meta_info"]["completion_tokens"] < len(whole.turns[0].output_ids)
        logged = sorted((e.rule, e.fault, e.trajectory, e.turn, e.attempt, e.request_id, e.endpoint)
                        for e in ctx.faults.log.events)
        assert logged == sorted(("abort_all_on_weight_update#0", "abort_all_on_weight_update", t.id, 0, 1, rids[t.id],
                                 "/update_weights_from_disk") for t in (streamed, whole))

    asyncio.run(run())


# -- HTTP faults -----------------------------------------------------------------------------------------------------
@STREAM
@pytest.mark.parametrize("spec", ["router_no_workers", "outage"])
def test_router_503_byte_for_byte(bench: Bench, stream: bool, spec: str) -> None:
    raw = send(bench, spec, stream=stream)
    assert raw.status == 503 and raw.complete and not raw.chunked
    assert raw.body == ROUTER_503
    assert raw.headers["content-type"] == "application/json"
    assert raw.headers["x-smg-error-code"] == "no_available_workers"
    assert "retry-after" not in raw.headers  # never a Retry-After
    seen = client(bench, spec, stream=False)
    assert seen.status == 503 and seen.value["error"]["code"] == "no_available_workers"


@pytest.mark.parametrize("spec", ["router_no_workers:router_version=0.2", "outage:router_version=0.2"])
def test_router_0_2_answers_text(bench: Bench, spec: str) -> None:
    raw = send(bench, spec, stream=False)
    assert (raw.status, raw.body, raw.headers["content-type"]) == (503, NO_WORKERS, "text/plain")
    assert "x-smg-error-code" not in raw.headers
    seen = client(bench, spec, stream=False)
    assert isinstance(seen.error, aiohttp.ContentTypeError) and seen.status == 503


HTTP_ERRORS = {  # status: (content type, exact body or None, what resp.json() gives)
    400: ("application/json", b'{"error":{"message":"Invalid request: injected by rollout-bench."}}', "json"),
    404: ("application/json", b'{"detail":"Not Found"}', "json"),
    429: (None, b"", "ContentTypeError"),
    500: ("text/plain", b"Internal Server Error", "ContentTypeError"),
    502: ("text/html", None, "ContentTypeError"),
    503: ("application/json", TIMEOUT_503, "json"),
    504: ("text/html", None, "ContentTypeError"),
}


@STREAM
@pytest.mark.parametrize("status", sorted(HTTP_ERRORS))
def test_http_error_bodies(bench: Bench, stream: bool, status: int) -> None:
    content_type, body, parsed = HTTP_ERRORS[status]
    raw = send(bench, f"http_error:status={status}", stream=stream)
    assert raw.status == status and raw.complete and not raw.chunked
    assert raw.headers.get("content-type") == content_type
    assert "retry-after" not in raw.headers and "x-smg-error-code" not in raw.headers
    if body is not None:
        assert raw.body == body
    else:
        assert raw.body.startswith(f"<html>\r\n<head><title>{status} ".encode()) and b"nginx" in raw.body
    if status == 400:
        assert set(raw.json()) == {"error"} and set(raw.json()["error"]) == {"message"}
    seen = client(bench, f"http_error:status={status}", stream=False)
    assert seen.status == status
    if parsed == "json":
        assert seen.error is None and seen.value == json.loads(body)
    else:
        assert isinstance(seen.error, aiohttp.ContentTypeError)


@pytest.mark.parametrize("status", [429, 503])
def test_http_error_retry_after(bench: Bench, status: int) -> None:
    raw = send(bench, f"http_error:status={status},retry_after=2", stream=False)
    assert raw.status == status and raw.headers["retry-after"] == "2"
    assert raw.body == HTTP_ERRORS[status][1]
    if status == 429:
        assert "content-type" not in raw.headers and raw.headers["content-length"] == "0"


@pytest.mark.parametrize("claimed", [None, "over"])
@STREAM
def test_context_length_error(bench: Bench, stream: bool, claimed: str | None) -> None:
    trajectory = bench.fresh()
    prompt = len(turn_input(trajectory, 0))
    context = prompt + 10  # the prompt fits, the prompt plus max_new_tokens does not
    spec = "context_length_error" if claimed is None else f"context_length_error:context_length={context}"
    raw = send(bench, spec, stream=stream, trajectory=trajectory)
    if claimed is None:  # by default the server claims a context exactly the prompt's length
        message = f"The input ({prompt} tokens) is longer than the model's context length ({prompt} tokens)."
    else:
        message = (f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                   f"You requested a total of {prompt + 1024} tokens: {prompt} tokens from the input messages and "
                   f"1024 tokens for the completion. Please reduce the number of tokens in the input messages or "
                   f"the completion to fit within the limit.")
    if stream:  # in band: HTTP 200, one error event, then [DONE]
        assert raw.status == 200 and raw.headers["content-type"] == "text/event-stream" and raw.complete
        error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
        assert raw.events() == [json.dumps({"error": error}, separators=(",", ":")).encode(), b"[DONE]"]
    else:
        assert raw.status == 400 and raw.headers["content-type"] == "application/json"
        assert raw.body == json.dumps({"error": {"message": message}}, separators=(",", ":")).encode()
    seen = client(bench, "context_length_error", stream=stream)
    assert seen.error is None
    error = seen.value[0]["error"] if stream else seen.value["error"]
    assert "is longer than the model's context length" in error["message"]  # verifiers' OverlongPromptError


@STREAM
def test_wrong_content_type(bench: Bench, stream: bool) -> None:
    raw = send(bench, "wrong_content_type", stream=stream)
    assert raw.status == 200 and raw.complete
    assert raw.headers["content-type"] == "application/octet-stream"
    recorded = _recorded(raw)
    final = json.loads(raw.events()[-2]) if stream else raw.json()  # the real answer, under the wrong type
    assert final["output_ids"] == list(recorded.output_ids)
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    if stream:
        assert raw.events()[-1] == b"[DONE]"
    seen = client(bench, "wrong_content_type:content_type=text/html", stream=stream)
    if stream:  # reading lines does not look at the content type
        assert seen.error is None and seen.done and seen.value[-1]["meta_info"]["finish_reason"]["type"] == "stop"
    else:
        assert isinstance(seen.error, aiohttp.ContentTypeError) and "text/html" in str(seen.error)


@STREAM
def test_malformed_json(bench: Bench, stream: bool) -> None:
    raw = send(bench, "malformed_json", stream=stream)
    assert raw.status == 200 and raw.complete
    if stream:
        events = raw.events()
        assert events[-1] == b"[DONE]"
        with pytest.raises(json.JSONDecodeError):
            json.loads(events[0])  # one event is cut...
        assert [json.loads(e)["meta_info"]["completion_tokens"] for e in events[1:-1]] == list(
            range(2, len(_recorded(raw).output_ids) + 1))  # ...the others are whole
    else:
        assert raw.headers["content-type"] == "application/json"
        assert int(raw.headers["content-length"]) == len(raw.body) > 0
        assert raw.body.startswith(b'{"text":')
        with pytest.raises(json.JSONDecodeError):
            raw.json()
    seen = client(bench, "malformed_json", stream=stream)
    assert isinstance(seen.error, json.JSONDecodeError) and isinstance(seen.error, ValueError)


# -- transport faults ------------------------------------------------------------------------------------------------
@STREAM
def test_connection_reset(bench: Bench, stream: bool) -> None:
    raw = send(bench, "connection_reset", stream=stream)
    assert raw.status is None and raw.body == b"" and not raw.timed_out  # not one byte of an answer
    seen = client(bench, "connection_reset", stream=stream)
    assert isinstance(seen.error, aiohttp.ServerDisconnectedError) and seen.status is None


def test_truncated_body_whole(bench: Bench) -> None:
    raw = send(bench, "truncated_body", stream=False)
    assert raw.status == 200 and raw.headers["content-type"] == "application/json"
    promised = int(raw.headers["content-length"])
    assert not raw.complete and len(raw.body) == promised // 2  # the headers promise the whole body
    with pytest.raises(json.JSONDecodeError):
        raw.json()
    seen = client(bench, "truncated_body:keep=0.9", stream=False)
    assert isinstance(seen.error, aiohttp.ClientPayloadError) and seen.status == 200


def test_truncated_body_stream(bench: Bench) -> None:
    raw = send(bench, "truncated_body", stream=True)
    total = len(_recorded(raw).output_ids)
    assert raw.status == 200 and raw.chunked and not raw.complete
    events = raw.events()
    assert len(events) == total // 2 and b"[DONE]" not in events
    assert raw.tail.startswith(b"data: {") and b"\n" not in raw.tail  # dies in the middle of an event
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw.tail[len(b"data: "):])
    seen = client(bench, "truncated_body", stream=True)
    assert isinstance(seen.error, aiohttp.ClientPayloadError) and not seen.done


@pytest.mark.parametrize("spec, done, terminated", [
    ("stream_cut:after=3", False, False),  # a worker killed mid-stream: the chunked body never ends
    ("stream_cut:after=3,clean=true", False, True),  # clean early EOF
    ("stream_cut:after=3,done=true", True, True),  # an early [DONE]
])
def test_stream_cut(bench: Bench, spec: str, done: bool, terminated: bool) -> None:
    raw = send(bench, spec, stream=True)
    assert raw.status == 200 and raw.chunked and raw.complete == terminated
    events = raw.events()
    assert raw.tail == b""
    assert events[3:] == ([b"[DONE]"] if done else [])
    items = [json.loads(e) for e in events[:3]]
    assert [i["meta_info"]["completion_tokens"] for i in items] == [1, 2, 3]
    assert all(i["meta_info"]["finish_reason"] is None for i in items)
    seen = client(bench, spec, stream=True)
    assert [i["meta_info"]["completion_tokens"] for i in seen.value] == [1, 2, 3] and seen.done == done
    if terminated:
        assert seen.error is None  # ends silently, no finish reason
    else:
        assert isinstance(seen.error, aiohttp.ClientPayloadError)


def test_stream_cut_after_zero_events(bench: Bench) -> None:
    raw = send(bench, "stream_cut:after=0,clean=true", stream=True)
    assert raw.status == 200 and raw.complete and raw.body == b""


@pytest.mark.parametrize("spec", ["stream_cut", "stream_no_finish_reason"])
def test_stream_faults_leave_whole_bodies_alone(bench: Bench, spec: str) -> None:
    raw = send(bench, spec, stream=False)
    final = _final(raw)
    assert final["output_ids"] == list(_recorded(raw).output_ids)
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    event = [e for e in bench.thread.context.faults.log.events if e.request_id == raw.rid][0]
    assert event.change == "not a stream: no effect"


def test_stream_no_finish_reason(bench: Bench) -> None:
    raw = send(bench, "stream_no_finish_reason", stream=True)
    assert raw.complete and raw.events()[-1] == b"[DONE]"
    items = raw.items()
    recorded = _recorded(raw)
    assert len(items) == len(recorded.output_ids)
    assert all(i["meta_info"]["finish_reason"] is None and "e2e_latency" not in i["meta_info"] for i in items)
    assert items[-1]["output_ids"] == list(recorded.output_ids)
    seen = client(bench, "stream_no_finish_reason", stream=True)
    assert seen.error is None and seen.done
    assert not any(i["meta_info"]["finish_reason"] for i in seen.value)  # slime: stays PENDING


@STREAM
def test_latency(bench: Bench, stream: bool) -> None:
    raw = send(bench, "latency:ms=300", stream=stream)
    assert raw.first_byte_after is not None and raw.first_byte_after >= 0.3  # nothing at all before the delay
    assert _final(raw)["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    raw = send(bench, "latency:ms=100,jitter_ms=200", stream=stream)
    change = [e for e in bench.thread.context.faults.log.events if e.request_id == raw.rid][0].change
    delay = float(re.fullmatch(r"delayed ([0-9.]+) ms", change).group(1))  # type: ignore[union-attr]
    assert 100 <= delay <= 300 and raw.elapsed >= delay / 1000 - 0.001


@STREAM
def test_slow_first_token(bench: Bench, stream: bool) -> None:
    raw = send(bench, "slow_first_token:seconds=0.4", stream=stream)
    if stream:
        assert raw.first_event_after is not None and raw.first_event_after >= 0.4
        assert len(raw.items()) == len(_recorded(raw).output_ids)
    assert raw.elapsed >= 0.4
    assert _final(raw)["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}


@STREAM
def test_stall(bench: Bench, stream: bool) -> None:
    raw = send(bench, "stall", stream=stream, timeout=0.6)
    assert raw.timed_out and raw.status is None and raw.elapsed >= 0.6  # not one byte: a black hole
    assert_one_event(bench.thread, "stall", raw.trajectory, raw.rid)  # type: ignore[arg-type]
    seen = client(bench, "stall", stream=stream, timeout=0.6)
    assert isinstance(seen.error, TimeoutError) and seen.status is None
    raw = send(bench, "stall:seconds=0.3", stream=stream)  # a stall that ends answers normally
    assert raw.first_byte_after is not None and raw.first_byte_after >= 0.3
    assert _final(raw)["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}


def test_forced_faults_hit_batches_item_by_item(bench: Bench) -> None:
    first, second = bench.fresh(), bench.fresh()
    body = _body(first, "x", False)
    body["input_ids"] = [turn_input(first, 0), turn_input(second, 0)]
    body["rid"] = [f"{first.id}:{uuid.uuid4().hex}", f"{second.id}:{uuid.uuid4().hex}"]  # a rid names its member
    reply = request(bench.url, "/generate", body, headers={"X-Bench-Fault": "missing_logprobs"})
    items = reply.json()
    assert [i["meta_info"]["id"] for i in items] == body["rid"]
    assert all(not LOGPROB_KEYS & set(i["meta_info"]) for i in items)
    events = [e for e in bench.thread.context.faults.log.events if e.request_id in body["rid"]]
    assert sorted((e.trajectory, e.request_id) for e in events) == sorted(
        zip([first.id, second.id], body["rid"]))


def test_no_fault_without_the_header(bench: Bench) -> None:
    before = len(bench.thread.context.faults.log)
    trajectory = bench.fresh()
    raw = raw_post(bench.url, _body(trajectory, uuid.uuid4().hex, False), {"X-Bench-Trajectory": trajectory.id})
    meta = raw.json()["meta_info"]
    assert [t[1] for t in meta["output_token_logprobs"]] == list(trajectory.turns[0].output_ids)
    assert len(bench.thread.context.faults.log) == before



# -- what the log records: only what reaches the client --------------------------------------------------------------
@pytest.mark.parametrize("header, fault, status", [
    ("missing_logprobs; http_error:status=503", "http_error", 503),
    ("http_error:status=503; missing_logprobs", "http_error", 503),
    ("abort; router_no_workers", "router_no_workers", 503),
    ("latency:ms=50; missing_logprobs; context_length_error", "context_length_error", 400),
    ("missing_logprobs; connection_reset", "connection_reset", None),
    ("http_error:status=503; http_error:status=429", "http_error", 429),  # the last error status stands
    ("connection_reset; context_length_error", "context_length_error", 400),  # a refusal beats a reset
    ("context_length_error; outage", "outage", 503),  # an error status beats a refusal
])
def test_a_preempting_fault_masks_the_others(bench: Bench, header: str, fault: str, status: int | None) -> None:
    """An error answer, a refusal or a reset replaces the generation: faults on that generation never show."""
    trajectory, rid = bench.fresh(), uuid.uuid4().hex
    raw = raw_post(bench.url, _body(trajectory, rid, False), _headers(trajectory, header))
    assert raw.status == status
    events = [e for e in bench.thread.context.faults.log.events if e.trajectory == trajectory.id]
    assert [(e.fault, e.request_id, e.attempt) for e in events] == [(fault, rid, 1)]
    shown = [i for i, spec in enumerate(header.split(";")) if spec.strip().startswith(fault)][-1]
    assert events[0].rule == f"header:{fault}#{shown}"


def test_a_recorded_error_turn_masks_faults_that_do_not_answer_for_it() -> None:
    with ServerThread("agentic-500") as thread:
        trajectory, turn = next((t, i) for t in thread.context.store.trajectories
                                for i, recorded in enumerate(t.turns) if recorded.error_status == 400)
        ids = turn_input(trajectory, turn)
        log = thread.context.faults.log

        def post(spec: str) -> Raw:
            body = {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 16}}
            return raw_post(thread.url, body, {"X-Bench-Trajectory": trajectory.id, "X-Bench-Fault": spec})

        raw = post("missing_logprobs; abort; latency:ms=20")
        assert raw.status == 400 and raw.json() == {"error": {"message": trajectory.turns[turn].error_message}}
        assert len(log) == 0  # the recorded 400 answered; none of those faults reached the client
        raw = post("missing_logprobs; router_no_workers")
        assert raw.status == 503 and raw.body == ROUTER_503  # the router answers before the worker
        raw = post("context_length_error:context_length=10")
        assert raw.status == 400 and raw.json()["error"]["message"].startswith(
            f"The input ({len(ids)} tokens) is longer than the model's context length (10 tokens).")
        assert [(e.fault, e.turn, e.attempt) for e in log.events] == [
            ("router_no_workers", turn, 2), ("context_length_error", turn, 3)]


def test_a_reset_attempt_counts_as_failed_so_its_headerless_retry_is_matched_to_the_same_member() -> None:
    """A GRPO group's identical prompts are told apart by arrival order; a member whose connection a fault reset
    has failed its attempt, so the client's retry (no trajectory header) is that member's attempt 2, not a
    sibling's second answer."""
    plan = plan_from_specs(["connection_reset:p=1,trajectories=g00003-1"], seed=0)
    with ServerThread("rlvr-500", plan=plan) as thread:
        group = thread.context.store.groups["g00003"].members
        body = {"input_ids": turn_input(group[0], 0), "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}
        replies = [raw_post(thread.url, {**body, "rid": uuid.uuid4().hex}, {}) for _ in range(len(group) + 1)]
        assert [r.reset for r in replies] == [False, True, False, False, True]  # the retry is g00003-1's: reset again
        log = [(r.trajectory, r.attempt) for r in thread.context.log.records]
        assert log == [("g00003-0", 1), ("g00003-1", 1), ("g00003-2", 1), ("g00003-3", 1), ("g00003-1", 2)]
        assert thread.context.log.records[1].error == "connection reset by a fault"
