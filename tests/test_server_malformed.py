"""Malformed /generate requests get SGLang's real status and body: never a traceback or a hang."""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import pytest

from bench.server import ServerThread
from tests.server_helpers import request, turn_input

IDS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerThread]]:
    with ServerThread("rlvr-500") as s15, ServerThread("rlvr-500", sglang_version="0.5.23") as s23:
        yield {"0.5.15": s15, "0.5.23": s23}


def _bad_request(kind: str, loc: tuple, msg: str, value: object) -> dict:
    detail = [{"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}]
    return {"object": "error", "message": repr(detail), "type": "Bad Request", "param": None, "code": 400}


def _value_error(message: str) -> dict:
    return {"error": {"message": message}}


CASES = [
    ("not json", None, b"{input_ids: [1]", 400, _bad_request("json_invalid", (0,), "JSON decode error", {})),
    ("json array", None, b"[1, 2]", 400, _bad_request(
        "model_attributes_type", (), "Input should be a valid dictionary or object to extract fields from", [1, 2])),
    ("ids not a list", {"input_ids": "abc"}, None, 400,
     _bad_request("list_type", ("input_ids",), "Input should be a valid list", "abc")),
    ("id not an int", {"input_ids": [1, "x"]}, None, 400,
     _bad_request("int_type", ("input_ids", 1), "Input should be a valid integer", "x")),
    ("text not a string", {"text": 5}, None, 400,
     _bad_request("string_type", ("text",), "Input should be a valid string", 5)),
    ("sampling not a dict", {"input_ids": IDS, "sampling_params": 3}, None, 400,
     _bad_request("dict_type", ("sampling_params",), "Input should be a valid dictionary", 3)),
    ("stream not a bool", {"input_ids": IDS, "stream": "yes"}, None, 400,
     _bad_request("bool_type", ("stream",), "Input should be a valid boolean", "yes")),
    ("text and ids", {"text": "hi", "input_ids": IDS}, None, 400,
     _value_error("Either text, input_ids or input_embeds should be provided.")),
    ("neither text nor ids", {"sampling_params": {}}, None, 400,
     _value_error("Either text, input_ids or input_embeds should be provided.")),
    ("negative temperature", {"input_ids": IDS, "sampling_params": {"temperature": -1.0}}, None, 400,
     _value_error("temperature must be a non-negative finite number, got -1.0.")),
    ("top_p zero", {"input_ids": IDS, "sampling_params": {"top_p": 0.0}}, None, 400,
     _value_error("top_p must be in (0, 1], got 0.0.")),
    ("top_k zero", {"input_ids": IDS, "sampling_params": {"top_k": 0}}, None, 400,
     _value_error("top_k must be -1 (disable) or at least 1, got 0.")),
    ("negative max_new_tokens", {"input_ids": IDS, "sampling_params": {"max_new_tokens": -1}}, None, 400,
     _value_error("max_new_tokens must be at least 0, got -1.")),
    ("min_p above one", {"input_ids": IDS, "sampling_params": {"min_p": 2}}, None, 400,
     _value_error("min_p must be in [0, 1], got 2.")),
    ("empty body", None, b"", 400, _bad_request("json_invalid", (0,), "JSON decode error", {})),
]


@pytest.mark.parametrize("name,body,raw,status,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_body(servers: dict[str, ServerThread], name: str, body: object, raw: bytes | None,
                        status: int, expected: dict) -> None:
    reply = request(servers["0.5.15"].url, "/generate", body, raw=raw, method="POST")
    assert reply.status == status and reply.headers["content-type"].startswith("application/json")
    assert reply.json() == expected


def test_unknown_sampling_key_per_version(servers: dict[str, ServerThread]) -> None:
    body = {"input_ids": IDS, "sampling_params": {"foo": 1}}
    old = request(servers["0.5.15"].url, "/generate", body)
    assert (old.status, old.headers["content-type"].split(";")[0], old.body) == (500, "text/plain",
                                                                                 b"Internal Server Error")
    new = request(servers["0.5.23"].url, "/generate", body)
    assert new.status == 400
    message = new.json()["error"]
    assert isinstance(message, str) and message.startswith("unknown field `foo`, expected one of `max_new_tokens`, ")


def test_mistyped_sampling_value_per_version(servers: dict[str, ServerThread]) -> None:
    body = {"input_ids": IDS, "sampling_params": {"temperature": "x"}}
    assert request(servers["0.5.15"].url, "/generate", body).status == 500
    new = request(servers["0.5.23"].url, "/generate", body)
    assert new.status == 400 and new.json() == {"error": 'invalid type: string "x", expected f32'}


def test_duplicate_rid_is_the_real_400() -> None:
    with ServerThread("rlvr-500", time_scale=100.0) as slow:
        trajectory = slow.context.store.trajectories[0]
        body = {"input_ids": turn_input(trajectory, 0), "rid": "same"}
        first = threading.Thread(target=lambda: request(slow.url, "/generate", body))
        first.start()
        deadline = time.monotonic() + 5
        while "same" not in slow.context.state.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        second = request(slow.url, "/generate", body)
        assert second.status == 400 and second.json() == _value_error("Duplicate request ID detected: same")
        request(slow.url, "/abort_request", {"abort_all": True})
        first.join(10)
        generated = [r.status for r in slow.context.log.records if r.endpoint == "/generate"]
        assert generated == [200, 400]  # in arrival order


def test_stream_value_errors_are_in_band(servers: dict[str, ServerThread]) -> None:
    reply = request(servers["0.5.15"].url, "/generate", {"input_ids": IDS, "stream": True,
                                                          "sampling_params": {"top_k": 0}})
    assert reply.status == 200
    events = reply.events()
    assert json.loads(events[0]) == {"error": {"message": "top_k must be -1 (disable) or at least 1, got 0.",
                                               "type": "invalid_request_error", "code": 400, "retryable": False}}
    assert events[1] == b"[DONE]"
