"""Bad requests to every route but /generate's own checks (tests/test_server_malformed.py): each gets a 4xx JSON
error in the engines' shape and a request-log row, never a 500 page or a traceback; the server keeps serving."""

from __future__ import annotations

import gzip
import json
from typing import Iterator

import pytest

from bench.server import ServerThread
from tests.server_helpers import request


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread("rlvr-500") as running:
        yield running


DEEP = b"[" * 5000 + b"]" * 5000
CASES = [  # (name, method, path, raw body, extra headers, status, a piece of the JSON answer)
    ("generate: not UTF-8", "POST", "/generate", b'{"text": "\xff\xfe"}', {}, 400, "json_invalid"),
    ("generate: nested 5,000 deep", "POST", "/generate", DEEP, {}, 400, "json_invalid"),
    ("generate: a body sent gzip-encoded (never decompressed, as uvicorn)", "POST", "/generate",
     gzip.compress(b'{"input_ids": [3, 4]}'), {"Content-Encoding": "gzip"}, 400, "json_invalid"),
    ("generate: a body whose Content-Encoding lies", "POST", "/generate", b"plain", {"Content-Encoding": "br"}, 400,
     "json_invalid"),
    ("generate: DELETE", "DELETE", "/generate", b"", {}, 405, "Method Not Allowed"),
    ("chat: not UTF-8", "POST", "/v1/chat/completions", b'{"messages": "\xff"}', {}, 400, "json_invalid"),
    ("chat: nested 5,000 deep", "POST", "/v1/chat/completions", DEEP, {}, 400, "json_invalid"),
    ("completions: not UTF-8", "POST", "/v1/completions", b"\xff", {}, 400, "json_invalid"),
    ("tokenize: a list", "POST", "/tokenize", b"[1]", {}, 400, "model_attributes_type"),
    ("tokenize: no prompt", "POST", "/tokenize", b'{"text": 5}', {}, 400, "missing"),
    ("tokenize: prompt a number", "POST", "/v1/tokenize", b'{"prompt": 5}', {}, 400, "string_type"),
    ("tokenize: messages without roles", "POST", "/tokenize", b'{"messages": [1]}', {}, 400, "model_type"),
    ("detokenize: tokens a string", "POST", "/detokenize", b'{"tokens": "x"}', {}, 400, "list_type"),
    ("detokenize: a token not an int", "POST", "/detokenize", b'{"tokens": [1, "x"]}', {}, 400, "int_type"),
    ("detokenize: past the vocabulary", "POST", "/v1/detokenize", b'{"tokens": [1099511627776]}', {}, 400,
     "Token id 1099511627776 is out of vocabulary"),
    ("detokenize: negative", "POST", "/detokenize", b'{"tokens": [-1]}', {}, 400, "out of vocabulary"),
    ("update_weight_version: no version", "POST", "/update_weight_version", b"{}", {}, 400, "missing"),
    ("update_weight_version: a list", "POST", "/update_weight_version", b'{"new_version": [1]}', {}, 400,
     "string_type"),
    ("update_weights_from_disk: a list", "POST", "/update_weights_from_disk", b"[]", {}, 400, "model_attributes_type"),
    ("update_weights_from_disk: abort flag a string", "POST", "/update_weights_from_disk",
     b'{"model_path": "m", "abort_all_requests": "yes"}', {}, 400, "bool_type"),
    ("abort_request: a list", "POST", "/abort_request", b"[]", {}, 400, "model_attributes_type"),
    ("abort_request: rid a number", "POST", "/abort_request", b'{"rid": 5}', {}, 400, "string_type"),
    ("bench/workers: not JSON", "POST", "/bench/workers", b"\xff", {}, 400, "not JSON"),
    ("bench/plan: nested 5,000 deep", "PUT", "/bench/plan", DEEP, {}, 400, "not JSON"),
    ("generate: an id past int32", "POST", "/generate", b'{"input_ids": [2147483648]}', {}, 400,
     "The input_ids [2147483648] contains values greater than the vocab size (1765)."),
    ("generate: an id past the vocabulary", "POST", "/generate", b'{"input_ids": [3, 200000]}', {}, 400,
     "contains values greater than the vocab size"),
    ("generate: a null id", "POST", "/generate", b'{"input_ids": [3, null]}', {}, 400, "int_type"),
    ("generate: a per-prompt option of the wrong type", "POST", "/generate",
     b'{"input_ids": [3, 4], "logprob_start_len": ["x"]}', {}, 400, "int_type"),
    ("generate: a negative id", "POST", "/generate", b'{"input_ids": [3, -1]}', {}, 400, "negative values"),
    ("generate: a batch with one bad prompt", "POST", "/generate", b'{"input_ids": [[3, 4], [99999999999999999999]]}',
     {}, 400, "greater than the vocab size"),
    ("generate: a fractional max_new_tokens", "POST", "/generate",
     b'{"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3.5}}', {}, 400, "max_new_tokens must be an integer"),
    ("generate: n past the limit", "POST", "/generate", b'{"input_ids": [3, 4], "sampling_params": {"n": 100000}}',
     {}, 400, "n must be at most 128"),
    ("chat: n past the limit", "POST", "/v1/chat/completions",
     b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 100000}', {}, 400, "n must be at most 128"),
    ("completions: n past the limit", "POST", "/v1/completions", b'{"model": "m", "prompt": "hi", "n": 129}', {}, 400,
     "n must be at most 128"),
    ("generate: a field nested as deep as JSON decodes", "POST", "/generate",
     b'{"input_ids": [3], "stream": ' + b"[" * 965 + b"]" * 965 + b"}", {}, 400, "bool_type"),
    ("tokenize: a prompt nested as deep as JSON decodes", "POST", "/tokenize",
     b'{"prompt": ' + b"[" * 965 + b"]" * 965 + b"}", {}, 400, "string_type"),
    ("chat: messages nested as deep as JSON decodes", "POST", "/v1/chat/completions",
     b'{"model": "m", "messages": ' + b"[" * 965 + b"]" * 965 + b"}", {}, 400, "dict_type"),
    ("generate: n below one", "POST", "/generate", b'{"input_ids": [3, 4], "sampling_params": {"n": -1}}', {}, 400,
     "n must be at least 1"),
    ("an unknown path", "GET", "/nope", b"", {}, 404, "Not Found"),
    ("a method no route takes", "PATCH", "/health", b"", {}, 405, "Method Not Allowed"),
]


@pytest.mark.parametrize("name, method, path, raw, headers, status, piece", CASES, ids=[c[0] for c in CASES])
def test_a_bad_request_gets_a_json_error_and_a_log_row(server: ServerThread, name: str, method: str, path: str,
                                                       raw: bytes, headers: dict[str, str], status: int,
                                                       piece: str) -> None:
    before = len(server.context.log)
    reply = request(server.url, path, method=method, raw=raw, headers=headers)
    assert reply.status == status, reply.raw[:300]
    assert reply.headers["content-type"].startswith("application/json")
    assert piece in json.dumps(reply.json())
    rows = server.context.log.records[before:]
    assert [(r.endpoint, r.status) for r in rows] == [(path, status)]
    assert request(server.url, "/health", method="GET").status == 200


def test_a_good_tokenize_and_detokenize_round_trip(server: ServerThread) -> None:
    tokens = request(server.url, "/tokenize", {"prompt": "The answer is 4."}).json()["tokens"]
    assert tokens and request(server.url, "/detokenize", {"tokens": tokens}).json() == {"text": "The answer is 4."}
    chat = request(server.url, "/v1/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len(chat["tokens"]) > 2


def test_a_whole_number_sent_as_a_float_is_taken_as_that_number(server: ServerThread) -> None:
    reply = request(server.url, "/generate", {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 2.0}})
    assert reply.status == 200 and reply.json()["meta_info"]["completion_tokens"] <= 2


def test_a_per_prompt_option_sent_as_null_takes_its_default(server: ServerThread) -> None:
    reply = request(server.url, "/generate", {"input_ids": [3, 4, 5], "return_logprob": True,
                                              "logprob_start_len": [None], "top_logprobs_num": [None]})
    assert reply.status == 200 and reply.json()["meta_info"]["input_token_logprobs"] == []


def test_an_input_too_deep_to_show_is_named_not_a_recursion_error() -> None:
    """The validation detail quotes the client's input; one nested past what `repr` walks is named instead."""
    from bench.server.wire import validation_detail

    deep: list = []
    for _ in range(20_000):
        deep = [deep]
    text = validation_detail("bool_type", ("stream",), "Input should be a valid boolean", deep)
    assert "'input': '<nested too deep to show>'" in text and "('body', 'stream')" in text


@pytest.mark.parametrize("method, path, allow", [("DELETE", "/generate", "POST,PUT"), ("PATCH", "/health", "GET,HEAD"),
                                                 ("GET", "/bench/workers", "POST")])
def test_a_405_lists_the_methods_the_path_takes(server: ServerThread, method: str, path: str, allow: str) -> None:
    """The catch-all route that answers what no route takes (`http_guard.guard_routes`) names the path's methods as
    aiohttp's router did when it answered them itself."""
    reply = request(server.url, path, method=method, raw=b"")
    assert (reply.status, reply.headers.get("allow"), reply.json()) == (405, allow, {"detail": "Method Not Allowed"})


def test_the_request_guard_wraps_the_routes_not_the_app() -> None:
    """No app middleware: with any, aiohttp adds a middleware chain and its own current-app layer to every request."""
    from bench.server.app import create_app, load_context

    app = create_app(load_context("rlvr-500"), control_token="secret")
    assert list(app.middlewares) == []
    handlers = {route.handler.__qualname__.split(".")[0] for route in app.router.routes()}
    assert handlers == {"_guard_generation", "_guard_logged"}
