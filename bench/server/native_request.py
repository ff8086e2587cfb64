"""Parsing and validating SGLang `/generate` bodies, with SGLang's own error answers.

Shape errors (wrong JSON types) are FastAPI's remapped 422; value errors are SGLang's
ValueErrors; unknown sampling keys crash 0.5.15 (500) and fail 0.5.23's schema pre-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bench.replay import GenerateParams
from bench.tokenizer import ByteBPETokenizer

from . import wire
from .profiles import SglangProfile

SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
)
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_INT_KEYS = {"max_new_tokens": "u32", "top_k": "i32", "min_new_tokens": "u32", "n": "u32", "stream_interval": "u32",
             "sampling_seed": "u64"}


class Rejected(Exception):
    """The request is answered with `response` before any generation."""

    def __init__(self, response: web.Response, why: str | None = None) -> None:
        super().__init__(response.status)
        self.response = response
        self.why = why  # for the request log, when the status alone would mislead (an engine-faithful 500)


class ValueRejected(Exception):
    """A ValueError: a 400 for plain requests, an in-band error event for streams."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class NativeItem:
    """One generation of a (possibly batched, possibly n>1) `/generate` request."""

    index: int
    ids: list[int]
    rid: str
    sampling: dict[str, Any]
    params: GenerateParams
    hint: str | None


@dataclass
class NativeRequest:
    items: list[NativeItem]
    batch: bool
    stream: bool
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool


def _pydantic_error(kind: str, location: tuple[Any, ...], message: str, value: Any) -> Rejected:
    return Rejected(wire.bad_request(wire.validation_detail(kind, location, message, value)))


def _expect(value: Any, kinds: tuple[type, ...], location: tuple[Any, ...], name: str) -> None:
    if value is None or (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)):
        return
    code, text = {"list": ("list_type", "Input should be a valid list"),
                  "dict": ("dict_type", "Input should be a valid dictionary"),
                  "str": ("string_type", "Input should be a valid string"),
                  "bool": ("bool_type", "Input should be a valid boolean"),
                  "int": ("int_type", "Input should be a valid integer")}[name]
    raise _pydantic_error(code, location, text, value)


def decode_body(raw: bytes) -> dict[str, Any]:
    try:
        body = wire.decode_json(raw)
    except wire.NotJson as error:
        raise _pydantic_error("json_invalid", (0,), "JSON decode error", {}) from error
    if not isinstance(body, dict):
        raise _pydantic_error("model_attributes_type", (), "Input should be a valid dictionary or object to "
                              "extract fields from", body)
    return body


def _check_ids(ids: list[Any], location: tuple[Any, ...]) -> None:
    """Token ids are ints (or lists of ints, for a batch). The usual all-int list is told by the set of its
    element types, built in C: a per-id Python check was a third of the bench's CPU in a run. Anything else
    takes the per-id walk, which names the first bad place as SGLang's pydantic does."""
    if set(map(type, ids)) <= _INT_ONLY:
        return
    for i, entry in enumerate(ids):
        if isinstance(entry, list) and len(location) == 1:
            _check_ids(entry, (*location, i))
        elif entry is None:  # `_expect` lets None pass (an optional field); an id may not be null
            raise _pydantic_error("int_type", (*location, i), "Input should be a valid integer", entry)
        else:
            _expect(entry, (int,), (*location, i), "int")


_INT_ONLY = frozenset({int})


def _check_shapes(body: dict[str, Any]) -> None:
    text, input_ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        for i, t in enumerate(text):
            _expect(t, (str,), ("text", i), "str")
    else:
        _expect(text, (str,), ("text",), "str")
    _expect(input_ids, (list,), ("input_ids",), "list")
    _check_ids(input_ids or [], ("input_ids",))
    sampling = body.get("sampling_params")
    if isinstance(sampling, list):
        for i, s in enumerate(sampling):
            _expect(s, (dict,), ("sampling_params", i), "dict")
    else:
        _expect(sampling, (dict,), ("sampling_params",), "dict")
    for key in ("stream", "return_text_in_logprobs", "return_prompt_token_ids"):
        _expect(body.get(key), (bool,), (key,), "bool")
    for key, kinds, name in (("return_logprob", (bool,), "bool"), ("logprob_start_len", (int,), "int"),
                             ("top_logprobs_num", (int,), "int"), ("rid", (str,), "str")):
        value = body.get(key)  # one value, or one per prompt (each may be null)
        if isinstance(value, list):
            for i, entry in enumerate(value):
                _expect(entry, kinds, (key, i), name)
        else:
            _expect(value, kinds, (key,), name)


def check_sampling(sampling: dict[str, Any], profile: SglangProfile) -> None:
    """SGLang's SamplingParams: unknown keys, types, then value ranges."""
    for key, value in sampling.items():
        if key not in SAMPLING_KEYS:
            if profile.schema_precheck:
                expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
                raise Rejected(wire.schema_error(f"unknown field `{key}`, expected one of {expected}"))
            raise Rejected(wire.internal_error(), f"as SGLang {profile.version}: unknown sampling key {key!r} makes "
                           "SamplingParams(**params) raise TypeError, answered 500")
        numeric = key in _FLOAT_KEYS or key in _INT_KEYS
        if numeric and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            if profile.schema_precheck:
                expected = "f32" if key in _FLOAT_KEYS else _INT_KEYS[key]
                raise Rejected(wire.schema_error(f"invalid type: {_serde_kind(value)}, expected {expected}"))
            raise Rejected(wire.internal_error(), f"as SGLang {profile.version}: {key}={value!r} makes "
                           "SamplingParams.verify() raise TypeError, answered 500")
        if key in _INT_KEYS and isinstance(value, float):
            if profile.schema_precheck:
                raise Rejected(wire.schema_error(f"invalid type: floating point `{value}`, expected {_INT_KEYS[key]}"))
            if not value.is_integer():  # SGLang would take it and count tokens against a fraction: the bench refuses
                raise ValueRejected(f"{key} must be an integer, got {value}.")
            sampling[key] = int(value)
    _check_stops(sampling, profile)
    temperature = sampling.get("temperature", 1.0)
    if temperature is not None and (temperature < 0 or not math.isfinite(temperature)):
        raise ValueRejected(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = sampling.get("top_p", 1.0)
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueRejected(f"top_p must be in (0, 1], got {top_p}.")
    top_k = sampling.get("top_k", -1)
    if top_k is not None and top_k != -1 and top_k < 1:
        raise ValueRejected(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    min_p = sampling.get("min_p", 0.0)
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueRejected(f"min_p must be in [0, 1], got {min_p}.")
    max_new = sampling.get("max_new_tokens", 128)
    if max_new is not None and max_new < 0:
        raise ValueRejected(f"max_new_tokens must be at least 0, got {max_new}.")


def _check_stops(sampling: dict[str, Any], profile: SglangProfile) -> None:
    """`stop` is a string or strings, `stop_token_ids` ints: SGLang's schema pre-check refuses anything else, and
    without it SamplingParams raises TypeError normalizing them (answered 500)."""
    stop, stop_ids = sampling.get("stop"), sampling.get("stop_token_ids")
    bad = None
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list) and all(
            isinstance(s, str) for s in stop)):
        bad = ("stop", stop, "a string or a sequence of strings")
    elif stop_ids is not None and not (isinstance(stop_ids, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in stop_ids)):
        bad = ("stop_token_ids", stop_ids, "a sequence of u32")
    if bad is None:
        return
    key, value, expected = bad
    if profile.schema_precheck:
        raise Rejected(wire.schema_error(f"invalid type: {_serde_kind(value)}, expected {expected}"))
    raise Rejected(wire.internal_error(), f"as SGLang {profile.version}: {key}={value!r} makes SamplingParams raise "
                   "TypeError, answered 500")


def _serde_kind(value: Any) -> str:
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "null" if value is None else f"value {value!r}"


def sampling_params(sampling: dict[str, Any], input_len: int) -> GenerateParams:
    stop = sampling.get("stop") or ()
    return GenerateParams(
        input_len=input_len,
        max_new_tokens=sampling.get("max_new_tokens", 128),
        stop_token_ids=frozenset(sampling.get("stop_token_ids") or ()),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        ignore_eos=bool(sampling.get("ignore_eos", False)),
        no_stop_trim=bool(sampling.get("no_stop_trim", False)),
    )


def _or(value: Any, default: Any) -> Any:
    """A per-prompt option's value, its default where the client sent null."""
    return default if value is None else value


def _first(value: Any, index: int, default: Any) -> Any:
    if isinstance(value, list):
        return value[index] if index < len(value) else default
    return default if value is None else value


def check_ids_in_vocabulary(ids: list[int], vocab_size: int) -> None:
    """SGLang's check, in its words, for ids past the vocabulary; negative ids (which crash the real model's
    embedding lookup) are refused too. `max`/`min` run in C: this sits on every request's path."""
    if ids and max(ids) >= vocab_size:
        raise ValueRejected(f"The input_ids {ids} contains values greater than the vocab size ({vocab_size}).")
    if ids and min(ids) < 0:
        raise ValueRejected(f"The input_ids {ids} contains negative values.")


def parse_generate(body: dict[str, Any], profile: SglangProfile, tokenizer: ByteBPETokenizer,
                   hint: str | None, max_n: int = 128) -> NativeRequest:
    """Turn a decoded `/generate` body into items, or raise `Rejected` / `ValueRejected`; `max_n`: the server's
    bound on the samples one prompt may ask for (`Limits.max_n`)."""
    _check_shapes(body)
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None) or body.get("input_embeds") is not None and (text or input_ids):
        raise ValueRejected("Either text, input_ids or input_embeds should be provided.")
    if input_ids is not None:
        batch = bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if batch else [input_ids]
        for prompt in prompts:
            check_ids_in_vocabulary(prompt, tokenizer.vocab_size)
    else:
        batch = isinstance(text, list)
        prompts = [tokenizer.encode(t) for t in (text if batch else [text])]
    raw_sampling = body.get("sampling_params")
    items: list[NativeItem] = []
    for position, ids in enumerate(prompts):
        sampling = dict(_first(raw_sampling, position, {}) or {})
        check_sampling(sampling, profile)
        rid = _first(body.get("rid"), position, None)
        n = sampling.get("n") or 1
        if isinstance(n, int) and n < 1:
            raise ValueRejected(f"n must be at least 1, got {n}.")
        if n > max_n:
            raise ValueRejected(f"n must be at most {max_n} (the bench server's limit, --max-n), got {n}.")
        for copy in range(n):
            own_rid = rid if (rid is not None and n == 1) else wire.fresh_id()
            items.append(NativeItem(len(items), list(ids), own_rid, sampling, sampling_params(sampling, len(ids)),
                                    hint or (rid if n == 1 else None)))
        batch = batch or n > 1
    return NativeRequest(
        items=items,
        batch=batch,
        stream=bool(body.get("stream", False)),
        return_logprob=bool(_first(body.get("return_logprob"), 0, False)),
        logprob_start_len=_or(_first(body.get("logprob_start_len"), 0, -1), -1),
        top_logprobs_num=_or(_first(body.get("top_logprobs_num"), 0, 0), 0),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs", False)),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids", False)),
    )
