"""HTTP fuzzing of every route: bodies, headers, methods and encodings drawn by Hypothesis. Whatever arrives, the
server answers (no hang), never with a 5xx (no fault plan is loaded, so no 5xx is injected), logs a row for the
request, and is healthy after. About 1,000 cases on a pull request, 10,000 nightly
(ROLLOUT_BENCH_HYPOTHESIS_PROFILE=nightly)."""

from __future__ import annotations

import http.client
import json
import os
import time
import zlib
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.server import ServerThread
from bench.server.app import create_app
from bench.testing.hypothesis_profiles import NIGHTLY, PROFILE_ENV, resolve

NIGHTLY_RUN = resolve(os.environ.get(PROFILE_ENV, "")) == NIGHTLY
CASES = 10_000 if NIGHTLY_RUN else 1_000
SHARES = {"fields": 0.5, "raw": 0.25, "headers": 0.25}  # of CASES, per test below
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread("rlvr-500") as running:
        yield running


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every route the mock serves, from its own router, so a new route is fuzzed too."""
    from bench.server.app import load_context

    app = create_app(load_context("rlvr-500"))
    found = {(route.method, route.resource.canonical) for route in app.router.routes()  # type: ignore[union-attr]
             if route.resource is not None}
    return sorted((("POST" if method == "*" else method), path) for method, path in found if method != "HEAD")


ROUTES = _routes()
PROMPT = list(range(3, 40))
TEMPLATES: dict[str, dict[str, Any]] = {  # a valid body per family, so drawn fields reach past the first checks
    "native": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
               "return_logprob": True, "stream": False},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8,
             "logprobs": True},
    "completion": {"model": "m", "prompt": PROMPT, "max_tokens": 8, "logprobs": 1},
    "admin": {"rid": "r", "abort_all": False, "new_version": "v2", "tokens": [5, 6], "prompt": "hi",
              "available": True, "mode": "abort", "faults": ["missing_logprobs"], "seed": 1},
}
KEYS = sorted({key for body in TEMPLATES.values() for key in body} | {
    "text", "n", "rid", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs", "stop", "stop_token_ids",
    "max_new_tokens", "min_new_tokens", "top_p", "top_k", "min_p", "ignore_eos", "skip_special_tokens",
    "stream_options", "tools", "tool_choice", "seed", "echo", "best_of", "toml", "content", "role"})


def _family(path: str) -> str:
    if path in ("/generate", "/inference/v1/generate"):
        return "native"
    if path == "/v1/chat/completions":
        return "chat"
    if path == "/v1/completions":
        return "completion"
    return "admin"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=24)


@st.composite
def mutated_bodies(draw: st.DrawFn, path: str) -> bytes:
    """A valid body with a few fields replaced, added or nested one level down (sampling_params, messages[0])."""
    body = json.loads(json.dumps(TEMPLATES[_family(path)]))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS) | st.text(max_size=8))
        value = draw(json_values | st.lists(st.integers(), max_size=8) | st.integers(-2**70, 2**70))
        where = draw(st.sampled_from(["top", "sampling", "message"]))
        if where == "sampling" and isinstance(body.get("sampling_params"), dict):
            body["sampling_params"][key] = value
        elif where == "message" and isinstance(body.get("messages"), list) and body["messages"]:
            if isinstance(body["messages"][0], dict):
                body["messages"][0][key] = value
        else:
            body[key] = value
    if draw(st.booleans()) and body.get("stream") is not None:
        body["stream"] = draw(st.booleans())
    return json.dumps(body).encode()


raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 3000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth),
    st.sampled_from([b"", b"null", b"NaN", b'{"input_ids": [NaN]}', b'{"input_ids": [1e400]}', b"\xef\xbb\xbf{}",
                     b'{"text": "\\ud800"}', b'{"a": 1, "a": 2}']))

header_sets = st.fixed_dictionaries({}, optional={
    "Content-Type": st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                     "multipart/form-data; boundary=x", "application/json; charset=latin-1", ""]),
    "Content-Encoding": st.sampled_from(["gzip", "deflate", "br", "identity", "x-unknown"]),
    "X-Bench-Trajectory": st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
    "X-Bench-Fault": st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    "Accept": st.sampled_from(["text/event-stream", "*/*", "application/json"]),
})


def _send(server: ServerThread, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        connection.request(method, path, body=body if method not in ("GET", "HEAD") else None, headers=headers)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def _check(server: ServerThread, method: str, path: str, body: bytes, headers: dict[str, str]) -> None:
    before, fired = len(server.context.log), len(server.context.faults.log)
    status, answer = _send(server, method, path, body, headers)  # a hang fails here, after TIMEOUT_S
    deadline = time.monotonic() + 2  # a request aiohttp's parser refused is logged just after its answer is sent
    while len(server.context.log) == before and time.monotonic() < deadline:
        time.sleep(0.001)
    rows = server.context.log.records[before:]
    injected = len(server.context.faults.log) > fired  # a drawn PUT /bench/plan may load faults: their 5xx are meant
    faithful = status == 500 and any((row.error or "").startswith("as SGLang ") for row in rows)  # the engine's own
    assert status < 500 or injected or faithful, f"{method} {path} {body[:200]!r} {headers}: {status} {answer[:300]!r}"
    assert rows, f"{method} {path} {headers}: no request-log row"
    assert _send(server, "GET", "/health", b"", {})[0] == 200
    _reset(server)


def _reset(server: ServerThread) -> None:
    """Undo what a drawn control request may have set, as a client would: generation paused, the router's worker
    taken away, a fault plan loaded. Each later case starts from a serving server."""
    for path, body in (("/continue_generation", b"{}"), ("/bench/workers", b'{"available": true}'),
                       ("/bench/plan", b'{"faults": [], "seed": 0}')):
        assert _send(server, "POST", path, body, {"Content-Type": "application/json"})[0] == 200


def _fuzz_settings(share: float) -> settings:
    return settings(max_examples=int(CASES * share), suppress_health_check=[HealthCheck.too_slow,
                    HealthCheck.function_scoped_fixture, HealthCheck.data_too_large], deadline=None)


@_fuzz_settings(SHARES["fields"])
@given(data=st.data())
def test_drawn_fields_in_valid_bodies(server: ServerThread, data: st.DataObject) -> None:
    method, path = data.draw(st.sampled_from([r for r in ROUTES if r[0] in ("POST", "PUT")]), label="route")
    body = data.draw(mutated_bodies(path), label="body")
    _check(server, method, path, body, {"Content-Type": "application/json"})


@_fuzz_settings(SHARES["raw"])
@given(route=st.sampled_from(ROUTES + [("POST", "/nope"), ("DELETE", "/generate"), ("GET", "/bench/../generate")]),
       body=raw_bodies)
def test_raw_bodies_on_every_route(server: ServerThread, route: tuple[str, str], body: bytes) -> None:
    _check(server, route[0], route[1], body, {"Content-Type": "application/json"})


@_fuzz_settings(SHARES["headers"])
@given(route=st.sampled_from(ROUTES), headers=header_sets, body=raw_bodies | st.just(b'{"input_ids": [3, 4, 5]}'),
       compress=st.booleans())
def test_headers_and_encodings(server: ServerThread, route: tuple[str, str], headers: dict[str, str], body: bytes,
                               compress: bool) -> None:
    if compress and headers.get("Content-Encoding") == "deflate":
        body = zlib.compress(body)  # a well-formed compressed body as well as broken ones
    _check(server, route[0], route[1], body, headers)
