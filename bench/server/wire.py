"""Bytes on the wire: compact JSON in insertion order, SSE framing, error bodies.

Error bodies are the real ones, per WIRE.md section 1.8 (native) and 3.1-3.2 (OpenAI); the
router's no-workers 503 (4.4) is built once, in `faults.catalogue.router_no_workers`.
"""

from __future__ import annotations

import os
import random
from http import HTTPStatus
from typing import Any

import msgspec
from aiohttp import web

from .profiles import SglangProfile

_encode = msgspec.json.Encoder().encode
JSON = "application/json"
SSE_DONE = b"data: [DONE]\n\n"


_V4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))  # the version nibble and the variant's two bits
_V4_SET = (0x4000 << 64) | (0x8000 << 48)


_IDS = random.Random()  # its own stream: an inline target's use of the global `random` must not shift, nor be shifted
os.register_at_fork(after_in_child=_IDS.seed)


def fresh_id() -> str:
    """A request id shaped as `uuid.uuid4().hex` (the engines' own), at a quarter of its CPU: random bits from a
    Mersenne Twister seeded once from the OS (again after a fork), and no `UUID` object per request."""
    return f"{_IDS.getrandbits(128) & _V4_CLEAR | _V4_SET:032x}"


class NotJson(ValueError):
    """A body that is not JSON: malformed, not UTF-8, or nested deeper than the decoder goes (about 1,000 levels)."""


def decode_json(raw: bytes) -> Any:
    """A request body as JSON, every way of not being JSON told as `NotJson` (never a traceback, never a 500)."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as error:
        raise NotJson(str(error)) from None


def dumps(obj: Any) -> bytes:
    """Compact JSON, keys in insertion order (SGLang's serialization)."""
    return _encode(obj)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type=JSON, headers=headers)


def text_response(text: str, status: int) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/plain")


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


# -- native SGLang ----------------------------------------------------------------------
def value_error(message: str) -> web.Response:
    """A ValueError in SGLang's tokenizer manager (context length, bad sampling value, duplicate rid)."""
    return json_response({"error": {"message": message}}, 400)


def validation_detail(kind: str, location: tuple[Any, ...], message: str, value: Any) -> str:
    """A pydantic validation error as FastAPI writes it (the repr of its detail list), for every route that reports
    one. An input nested deeper than `repr` can walk (JSON decodes to about 1,000 levels) is named, not shown."""
    detail = [{"type": kind, "loc": ("body", *location), "msg": message, "input": value}]
    try:
        return repr(detail)
    except RecursionError:
        detail[0]["input"] = "<nested too deep to show>"
        return repr(detail)


def bad_request(message: str) -> web.Response:
    """FastAPI's 422 for a body of the wrong shape, as SGLang remaps it."""
    return json_response({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
                         400)


def schema_error(message: str) -> web.Response:
    """0.5.23's sampling-parameter schema pre-check: `error` is a string."""
    return json_response({"error": message}, 400)


def internal_error() -> web.Response:
    """An uncaught exception in SGLang: plain text."""
    return text_response("Internal Server Error", 500)


def scheduler_error(status: int, message: str) -> web.Response:
    return json_response({"object": "error", "message": message, "type": str(status), "param": None, "code": status},
                         status)


def stream_error_event(profile: SglangProfile, message: str, code: int = 400) -> bytes:
    if profile.rich_stream_errors:
        error = {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}
    else:
        error = {"message": message}
    return sse({"error": error})


# -- OpenAI-compatible routes (WIRE.md 3.1-3.3) ---------------------------------------------
_OPENAI_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                       501: "NotImplementedError", 503: "ServiceUnavailableError"}


def openai_error_type(status: int) -> str:
    """The `type` vLLM and SGLang write for an error of HTTP status `status`."""
    if status in _OPENAI_ERROR_TYPES:
        return _OPENAI_ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def openai_error_body(flavor: str, message: str, status: int = 400, err_type: str | None = None,
                      param: str | None = None) -> dict[str, Any]:
    """vLLM >= 0.10.1 nests the error under `error`; SGLang's is flat with `object: "error"`."""
    kind = err_type or openai_error_type(status)
    if flavor == "sglang":
        return {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def openai_error(flavor: str, message: str, status: int = 400, err_type: str | None = None,
                 param: str | None = None) -> web.Response:
    return json_response(openai_error_body(flavor, message, status, err_type, param), status)


def openai_stream_error(flavor: str, message: str, status: int = 400, err_type: str | None = None,
                        param: str | None = None) -> bytes:
    """The in-band error event of an OpenAI stream; `data: [DONE]` follows it."""
    body = openai_error_body(flavor, message, status, err_type, param)
    return sse(body if flavor != "sglang" else {"error": body})
