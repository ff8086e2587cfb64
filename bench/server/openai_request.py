"""OpenAI-compatible request bodies (WIRE.md 3.1-3.3) turned into what the replay needs.

Shape problems (bad JSON, a missing or mistyped field) are FastAPI validation errors, which
both servers answer 400 with `type` "Bad Request"; value problems are the servers' own
checks (`type` "BadRequestError"). Either way nothing is generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from bench.replay import GenerateParams
from bench.tokenizer import ByteBPETokenizer

from . import wire

SCHEMA = "Bad Request"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's and SGLang's CompletionRequest / SamplingParams default
_KINDS: dict[str, tuple[tuple[type, ...], str, str]] = {
    "int": ((int,), "int_type", "Input should be a valid integer"),
    "number": ((int, float), "float_type", "Input should be a valid number"),
    "bool": ((bool,), "bool_type", "Input should be a valid boolean"),
    "str": ((str,), "string_type", "Input should be a valid string"),
    "list": ((list,), "list_type", "Input should be a valid list"),
    "dict": ((dict,), "dict_type", "Input should be a valid dictionary"),
}


class BadRequest(Exception):
    """A body refused before generation; answered 400 in the flavor's error envelope."""

    def __init__(self, message: str, err_type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.err_type, self.param = message, err_type, param


@dataclass(frozen=True)
class Sampling:
    """The sampling options that shape a replayed answer."""

    max_tokens: int | None  # None: up to the context
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    keep_stop: bool = False  # vLLM include_stop_str_in_output / SGLang no_stop_trim
    skip_special_tokens: bool = True
    min_tokens: int = 0

    def params(self, input_len: int, context_length: int) -> GenerateParams:
        budget = self.max_tokens if self.max_tokens is not None else max(0, context_length - input_len)
        return GenerateParams(input_len, budget, self.stop_token_ids, self.stop, self.ignore_eos, self.keep_stop)


@dataclass
class OpenAIRequest:
    """One parsed chat, completions or token-generate request."""

    kind: str  # "chat" | "completion" | "generate"
    prompts: list[list[int]]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    tools: list[Any] | None = None
    parse_tools: bool = False
    client_id: str | None = None  # vLLM `request_id` / SGLang `rid`
    return_prompt_token_ids: bool = False  # SGLang chat extension


def _schema(kind: str, location: tuple[Any, ...], message: str, value: Any) -> BadRequest:
    """A pydantic validation error as FastAPI reports it."""
    return BadRequest(wire.validation_detail(kind, location, message, value), SCHEMA)


def decode_body(raw: bytes) -> dict[str, Any]:
    try:
        body = wire.decode_json(raw)
    except wire.NotJson:
        raise _schema("json_invalid", (0,), "JSON decode error", {}) from None
    if not isinstance(body, dict):
        raise _schema("model_attributes_type", (), "Input should be a valid dictionary or object to extract "
                      "fields from", body)
    return body


def _opt(body: dict[str, Any], key: str, kind: str, where: tuple[Any, ...] = ()) -> Any:
    """`body[key]` checked against `kind`; None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    kinds, code, message = _KINDS[kind]
    if not isinstance(value, kinds) or (isinstance(value, bool) and kind != "bool"):
        raise _schema(code, (*where, key), message, value)
    return value


def _required(body: dict[str, Any], key: str, kind: str) -> Any:
    if key not in body:
        raise _schema("missing", (key,), "Field required", body)
    value = _opt(body, key, kind)
    if value is None:
        raise _schema(_KINDS[kind][1], (key,), _KINDS[kind][2], None)
    return value


def _int_list(value: Any, location: tuple[Any, ...]) -> list[int]:
    if not isinstance(value, list):
        raise _schema("list_type", location, "Input should be a valid list", value)
    for i, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool):
            raise _schema("int_type", (*location, i), "Input should be a valid integer", item)
    return value


def _stop(body: dict[str, Any], where: tuple[Any, ...] = ()) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise _schema("string_type", (*where, "stop"), "Input should be a valid string", stop)


def _check_vocab(ids: list[int], tokenizer: ByteBPETokenizer) -> None:
    bad = [i for i in ids if not 0 <= i < tokenizer.vocab_size]
    if bad:
        raise BadRequest(f"Token id {max(bad)} is out of vocabulary")


def _check_values(body: dict[str, Any], sampling: Sampling, flavor: str, where: tuple[Any, ...] = ()) -> None:
    """The servers' own range checks, with their texts."""
    temperature = _opt(body, "temperature", "number", where)
    if temperature is not None and (temperature < 0 or not math.isfinite(temperature)):
        raise BadRequest(f"temperature must be a non-negative finite number, got {float(temperature)}."
                         if flavor == "sglang" else f"temperature must be non-negative, got {float(temperature)}.")
    top_p = _opt(body, "top_p", "number", where)
    if top_p is not None and not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {float(top_p)}.")
    if sampling.n < 1:
        raise BadRequest(f"n must be at least 1, got {sampling.n}.")
    floor = 0 if flavor == "sglang" else 1
    if sampling.max_tokens is not None and sampling.max_tokens < floor:
        name = "max_new_tokens" if flavor == "sglang" else "max_tokens"
        raise BadRequest(f"{name} must be at least {floor}, got {sampling.max_tokens}.")
    if sampling.min_tokens < 0:
        raise BadRequest(f"min_tokens must be greater than or equal to 0, got {sampling.min_tokens}.")
    if sampling.max_tokens is not None and sampling.min_tokens > sampling.max_tokens:
        raise BadRequest(f"min_tokens must be less than or equal to max_tokens={sampling.max_tokens}, "
                         f"got {sampling.min_tokens}.")


def _check_salt(body: dict[str, Any]) -> None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")


def _sampling(body: dict[str, Any], flavor: str, max_tokens: int | None, where: tuple[Any, ...] = ()) -> Sampling:
    stop_ids = _opt(body, "stop_token_ids", "list", where)
    keep_key = "no_stop_trim" if flavor == "sglang" else "include_stop_str_in_output"
    skip = _opt(body, "skip_special_tokens", "bool", where)
    n = _opt(body, "n", "int", where)
    sampling = Sampling(
        max_tokens=max_tokens,
        n=1 if n is None else n,
        stop=_stop(body, where),
        stop_token_ids=frozenset(_int_list(stop_ids, (*where, "stop_token_ids")) if stop_ids else ()),
        ignore_eos=bool(_opt(body, "ignore_eos", "bool", where)),
        keep_stop=bool(_opt(body, keep_key, "bool", where)),
        skip_special_tokens=True if skip is None else skip,
        min_tokens=_opt(body, "min_tokens", "int", where) or 0,
    )
    _check_values(body, sampling, flavor, where)
    return sampling


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(_opt(body, "stream", "bool"))
    options = _opt(body, "stream_options", "dict")
    if options is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    include_usage = bool(_opt(options or {}, "include_usage", "bool", ("stream_options",)))
    return stream, include_usage


def _client_id(body: dict[str, Any], flavor: str) -> str | None:
    return _opt(body, "rid" if flavor == "sglang" else "request_id", "str")


def _message_text(content: Any) -> Any:
    """Text parts of a multi-part message joined the way vLLM joins them; other content as is."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def _render_chat(messages: list[Any], tools: list[Any] | None, tokenizer: ByteBPETokenizer) -> list[int]:
    normalized = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _schema("dict_type", ("messages", i), "Input should be a valid dictionary", message)
        if not isinstance(message.get("role"), str):
            raise _schema("missing", ("messages", i, "role"), "Field required", message)
        normalized.append({**message, "content": _message_text(message.get("content"))})
    try:
        text = tokenizer.apply_chat_template(normalized, tools=tools, add_generation_prompt=True)
    except Exception as error:  # a template failure is the client's message shape, not a server crash
        raise BadRequest(f"Chat template error: {error}") from None
    return list(_prompt_ids(tokenizer, text))


@lru_cache(maxsize=256)
def _prompt_ids(tokenizer: ByteBPETokenizer, text: str) -> tuple[int, ...]:
    """Ids of a rendered chat prompt, cached by its text: encoding is most of the chat route's cost, and a
    group of samples sends the same prompt several times in a row (benchmarks/tokenizer_speed.py measures
    both). Keyed by text, not by the request body, so a miss costs only a hash; 256 prompts stay cached."""
    return tuple(tokenizer.encode(text))


def parse_chat(body: dict[str, Any], flavor: str, tokenizer: ByteBPETokenizer) -> OpenAIRequest:
    """A `/v1/chat/completions` body."""
    messages = _required(body, "messages", "list")
    tools = _opt(body, "tools", "list")
    limit = _opt(body, "max_completion_tokens", "int")
    if limit is None:
        limit = _opt(body, "max_tokens", "int")
    stream, include_usage = _stream_flags(body)
    logprobs = bool(_opt(body, "logprobs", "bool"))
    top = _opt(body, "top_logprobs", "int") or 0
    if top < 0:
        raise BadRequest("top_logprobs must be a positive value.")
    if top > 0 and not logprobs:
        raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true.")
    sampling = _sampling(body, flavor, limit)
    _check_salt(body)
    ids = _render_chat(messages, tools, tokenizer)
    return OpenAIRequest(
        kind="chat", prompts=[ids], sampling=sampling, stream=stream, include_usage=include_usage,
        logprobs=logprobs, top_logprobs=top, return_token_ids=bool(_opt(body, "return_token_ids", "bool")),
        tokens_as_ids=bool(_opt(body, "return_tokens_as_token_ids", "bool")), tools=tools,
        parse_tools=bool(tools) and body.get("tool_choice") != "none", client_id=_client_id(body, flavor),
        return_prompt_token_ids=bool(_opt(body, "return_prompt_token_ids", "bool")),
    )


def _prompts(body: dict[str, Any], tokenizer: ByteBPETokenizer) -> list[list[int]]:
    """`prompt` as a string, a list of ids, or a list of either."""
    if "prompt" not in body:
        raise _schema("missing", ("prompt",), "Field required", body)
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if not isinstance(prompt, list) or not prompt:
        if isinstance(prompt, list):
            raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.")
        raise _schema("string_type", ("prompt",), "Input should be a valid string", prompt)
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompts = [prompt]
    else:
        prompts = []
        for i, entry in enumerate(prompt):
            prompts.append(tokenizer.encode(entry) if isinstance(entry, str) else _int_list(entry, ("prompt", i)))
    for ids in prompts:
        if not ids:
            raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.")
        _check_vocab(ids, tokenizer)
    return prompts


def parse_completion(body: dict[str, Any], flavor: str, tokenizer: ByteBPETokenizer) -> OpenAIRequest:
    """A `/v1/completions` body (`logprobs` is an int here: the number of alternatives)."""
    prompts = _prompts(body, tokenizer)
    limit = _opt(body, "max_tokens", "int")  # null means the default here, not "up to the context"
    limit = COMPLETION_DEFAULT_MAX_TOKENS if limit is None else limit
    stream, include_usage = _stream_flags(body)
    logprobs = _opt(body, "logprobs", "int")
    if logprobs is not None and logprobs < -1:
        raise BadRequest("`logprobs` must be a positive value or -1.")
    _check_salt(body)
    return OpenAIRequest(
        kind="completion", prompts=prompts, sampling=_sampling(body, flavor, limit), stream=stream,
        include_usage=include_usage, logprobs=logprobs is not None, top_logprobs=logprobs or 0,
        return_token_ids=bool(_opt(body, "return_token_ids", "bool")),
        tokens_as_ids=bool(_opt(body, "return_tokens_as_token_ids", "bool")), client_id=_client_id(body, flavor),
    )


def parse_generate(body: dict[str, Any], tokenizer: ByteBPETokenizer) -> OpenAIRequest:
    """A vLLM `/inference/v1/generate` body: token ids in, token ids out."""
    ids = _int_list(_required(body, "token_ids", "list"), ("token_ids",))
    if not ids:
        raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.")
    _check_vocab(ids, tokenizer)
    sampling_body = _opt(body, "sampling_params", "dict") or {}
    where = ("sampling_params",)
    limit = (_opt(sampling_body, "max_tokens", "int", where) if "max_tokens" in sampling_body
             else COMPLETION_DEFAULT_MAX_TOKENS)
    logprobs = _opt(sampling_body, "logprobs", "int", where)
    stream, include_usage = _stream_flags(body)
    _check_salt(body)
    return OpenAIRequest(
        kind="generate", prompts=[ids], sampling=_sampling(sampling_body, "vllm", limit, where), stream=stream,
        include_usage=include_usage, logprobs=logprobs is not None, top_logprobs=logprobs or 0,
        return_token_ids=True, tokens_as_ids=True, client_id=_opt(body, "request_id", "str"),
    )
