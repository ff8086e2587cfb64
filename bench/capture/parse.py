"""Live traffic, read back: what a client asked and what an SGLang or vLLM server answered.

The recorder and the fault proxy see requests and answers as bytes on the wire (WIRE.md sections 1 and 3). This
module turns them into `CapturedInput`s (one per generation a request asks for: batch entries times `n`) and
`CapturedAnswer`s (SGLang's view of one answer, what a trace `Response` holds). It never raises on an answer:
a body it cannot read becomes an answer with an `error` saying what was wrong, because a proxy must forward
whatever the server said and a recording must keep it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

NATIVE_ROUTES = frozenset({"/generate"})
OPENAI_ROUTES = {"/v1/completions": "completion", "/v1/chat/completions": "chat", "/inference/v1/generate": "generate"}
GENERATION_PATHS = NATIVE_ROUTES | frozenset(OPENAI_ROUTES)


class CaptureError(ValueError):
    """A request the bench cannot read (not JSON, not a generation request of a known shape)."""


@dataclass
class CapturedInput:
    """One generation a request asks for: its input in the form the client sent, and its sampling parameters."""

    input_ids: list[int] | None
    text: str | None
    messages: list[dict[str, Any]] | None
    sampling_params: dict[str, Any]
    tools: list[dict[str, Any]] | None = None


@dataclass
class CapturedRequest:
    api: str  # "native" | "openai"
    kind: str  # "generate" (native), "completion", "chat", "generate" (vLLM token-in)
    endpoint: str
    stream: bool
    inputs: list[CapturedInput]  # in answer order: batch entries, each repeated n times
    wants_logprobs: bool


@dataclass
class CapturedError:
    status: int
    message: str
    body: str = ""  # the error body as sent (its first 4 KiB), for the recording's metadata

BODY_KEPT = 4096


@dataclass
class CapturedAnswer:
    """SGLang's view of one answer (`output_ids` and `logprobs` include a matched stop token)."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    text: str = ""
    finish_reason: dict[str, Any] | None = None
    weight_version: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft: float = 0.0
    total: float = 0.0
    error: CapturedError | None = None
    prompt_ids: list[int] | None = None  # the prompt's ids when the server reported them (OpenAI routes)
    ids_known: bool = True  # False: the server sent text only (SGLang's OpenAI routes); `output_ids` is empty
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI chat: parsed calls (name, arguments)
    logprobs_dropped: bool = False  # a stream sent logprobs not one per id: not kept, but the engine did send some

    @property
    def outcome(self) -> str:
        """"stop" | "length" | "abort" | "error": what a tracker needs to know of the attempt."""
        if self.error is not None:
            return "error"
        kind = (self.finish_reason or {}).get("type")
        return kind if kind in ("stop", "length", "abort") else "abort"


def _decode_json(raw: bytes, what: str) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise CaptureError(f"{what} is not valid JSON ({error})") from None


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


# -- requests ------------------------------------------------------------------------------
def parse_request(path: str, raw: bytes) -> CapturedRequest:
    """The generations a request to `path` asks for; `CaptureError` for a body no server would take either."""
    body = _decode_json(raw, f"{path} request body")
    if not isinstance(body, dict):
        raise CaptureError(f"{path} request body must be a JSON object, got {type(body).__name__}")
    if path in NATIVE_ROUTES:
        return _native_request(path, body, raw)
    if path in OPENAI_ROUTES:
        return _openai_request(path, OPENAI_ROUTES[path], body)
    raise CaptureError(f"{path} is not a generation route ({', '.join(sorted(GENERATION_PATHS))})")


class _SingleIds(msgspec.Struct):
    """The common native request: one prompt as ids (its ids checked in C, not one by one in Python)."""

    input_ids: list[int]


_single_ids = msgspec.json.Decoder(_SingleIds)


def _native_ids(raw: bytes, body: dict[str, Any]) -> list[list[int]] | None:
    """The prompts of a request sent as ids, or None when it was sent as text."""
    ids = body.get("input_ids")
    if ids is None:
        return None
    try:
        return [_single_ids.decode(raw).input_ids]
    except msgspec.ValidationError:
        pass
    if isinstance(ids, list) and ids and all(_int_list(entry) for entry in ids):
        return [list(entry) for entry in ids]
    return []


def _native_request(path: str, body: dict[str, Any], raw: bytes) -> CapturedRequest:
    text = body.get("text")
    batch = _native_ids(raw, body)
    if batch is not None:
        prompts: list[tuple[list[int] | None, str | None]] = [(entry, None) for entry in batch]
        if not prompts:
            raise CaptureError(f"{path}: input_ids must be a list of token ids or a list of such lists")
    elif isinstance(text, str):
        prompts = [(None, text)]
    elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        prompts = [(None, t) for t in text]
    else:
        raise CaptureError(f"{path}: the request has neither input_ids nor text")
    sampling = body.get("sampling_params") or {}
    samplings = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    if len(samplings) != len(prompts) or not all(isinstance(s, dict) for s in samplings):
        raise CaptureError(f"{path}: sampling_params must be an object or one object per input")
    inputs = []
    for (prompt_ids, prompt_text), params in zip(prompts, samplings):
        n = params.get("n", 1)
        copies = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        inputs.extend(CapturedInput(prompt_ids, prompt_text, None, dict(params)) for _ in range(copies))
    return CapturedRequest("native", "generate", path, body.get("stream") is True, inputs,
                           body.get("return_logprob") is True)


_OPENAI_SAMPLING = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
                    "stop_token_ids", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
                    "ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "min_tokens", "logprobs",
                    "top_logprobs", "return_token_ids", "return_prompt_token_ids", "tool_choice")


def _openai_request(path: str, kind: str, body: dict[str, Any]) -> CapturedRequest:
    if kind == "generate":
        ids = body.get("token_ids")
        if not _int_list(ids):
            raise CaptureError(f"{path}: token_ids must be a list of token ids")
        params = dict(body.get("sampling_params") or {})
        n = params.get("n", 1)
        copies = n if isinstance(n, int) and n > 0 else 1
        inputs = [CapturedInput(list(ids), None, None, params) for _ in range(copies)]
        return CapturedRequest("openai", kind, path, body.get("stream") is True, inputs, params.get("logprobs") is not None)
    params = {key: body[key] for key in _OPENAI_SAMPLING if key in body}
    n = body.get("n", 1)
    copies = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    wants = bool(body.get("logprobs"))
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise CaptureError(f"{path}: messages must be a list of message objects")
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        inputs = [CapturedInput(None, None, messages, params, tools) for _ in range(copies)]
        return CapturedRequest("openai", kind, path, body.get("stream") is True, inputs, wants)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif _int_list(prompt) and prompt:
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise CaptureError(f"{path}: prompt must be a string, a list of token ids, or a list of either")
    inputs = []
    for entry in prompts:
        if isinstance(entry, str):
            inputs.extend(CapturedInput(None, entry, None, params) for _ in range(copies))
        elif _int_list(entry):
            inputs.extend(CapturedInput(list(entry), None, None, params) for _ in range(copies))
        else:
            raise CaptureError(f"{path}: each prompt must be a string or a list of token ids")
    return CapturedRequest("openai", kind, path, body.get("stream") is True, inputs, wants)


# -- answers -------------------------------------------------------------------------------
def error_answers(request: CapturedRequest, status: int, raw: bytes, elapsed: float) -> list[CapturedAnswer]:
    """An HTTP error (or an in-band stream error) answers every generation of the request."""
    message = error_message(raw)
    body = raw[:BODY_KEPT].decode("utf-8", "replace")
    return [CapturedAnswer(error=CapturedError(status, message, body), ttft=elapsed, total=elapsed,
                           ids_known=True) for _ in request.inputs]


def error_message(raw: bytes) -> str:
    """The message of an error body in any of the shapes servers and routers send (WIRE.md 1.8, 3.x, 4.4)."""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw.decode("utf-8", "replace").strip()[:2000] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return body[key]
    return raw.decode("utf-8", "replace")[:2000]


def parse_answer(request: CapturedRequest, status: int, raw: bytes, elapsed: float) -> list[CapturedAnswer]:
    """The answers of a non-stream reply, one per input; an error status or an unreadable body answers all."""
    if status >= 400:
        return error_answers(request, status, raw, elapsed)
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        return error_answers(request, 502, f"unreadable {status} body: {error}".encode(), elapsed)
    try:
        answers = _native_items(body) if request.api == "native" else _openai_choices(request, body)
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        return error_answers(request, 502, f"unexpected {status} body shape: {error!r}".encode(), elapsed)
    if len(answers) != len(request.inputs):
        return error_answers(request, 502, (f"the reply holds {len(answers)} answers for "
                                            f"{len(request.inputs)} generations").encode(), elapsed)
    for answer in answers:
        answer.ttft = answer.total = elapsed
    return answers


def _native_items(body: Any) -> list[CapturedAnswer]:
    items = body if isinstance(body, list) else [body]
    return [_native_item(item) for item in items]


def _native_item(item: dict[str, Any]) -> CapturedAnswer:
    meta = item["meta_info"]
    pairs = meta.get("output_token_logprobs")
    ids = item.get("output_ids")
    if ids is None and pairs is not None:
        ids = [pair[1] for pair in pairs]  # 0.4.10 sends no output_ids; the logprob triples carry them
    known = ids is not None
    logprobs = None if pairs is None else [pair[0] for pair in pairs]
    finish = meta.get("finish_reason") or {"type": "abort", "message": "the answer carried no finish reason"}
    return CapturedAnswer(output_ids=list(ids or []), logprobs=logprobs, text=item.get("text") or "",
                          finish_reason=finish, weight_version=meta.get("weight_version"),
                          prompt_tokens=meta.get("prompt_tokens") or 0,
                          completion_tokens=meta.get("completion_tokens") or len(ids or []),
                          cached_tokens=meta.get("cached_tokens") or 0, ids_known=known)


def _openai_finish(reason: Any, stop_reason: Any, ids: list[int], completion: int) -> dict[str, Any] | None:
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": completion}
    if reason in ("stop", "tool_calls"):
        matched = stop_reason if stop_reason is not None else (ids[-1] if ids else None)
        return {"type": "stop", "matched": matched}
    return {"type": "abort", "message": str(reason)}


def _openai_logprobs(logprobs: Any) -> list[float | None] | None:
    """The sampled tokens' logprobs as sent; a null one stays None (the recording then keeps none, noted)."""
    if not isinstance(logprobs, dict):
        return None
    if "content" in logprobs:
        content = logprobs["content"] or []
        return [entry["logprob"] for entry in content]
    values = logprobs.get("token_logprobs")
    return None if values is None else list(values)


def _logprob_token_ids(logprobs: Any) -> list[int] | None:
    """The ids vLLM names in logprob entries under `return_tokens_as_token_ids` (`"token_id:123"`); None otherwise."""
    if not isinstance(logprobs, dict):
        return None
    tokens = ([entry.get("token") for entry in logprobs["content"] or []] if "content" in logprobs
              else logprobs.get("tokens"))
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    try:
        return [int(t[9:]) for t in tokens]
    except ValueError:
        return None


def _openai_choices(request: CapturedRequest, body: dict[str, Any]) -> list[CapturedAnswer]:
    version = (body.get("metadata") or {}).get("weight_version")
    usage = body.get("usage") or {}
    top_prompt = body.get("prompt_token_ids")
    answers = []
    for choice in sorted(body["choices"], key=lambda c: c.get("index", 0)):
        answers.append(_openai_choice(request, choice, version, top_prompt))
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    for answer in answers:
        answer.cached_tokens = cached
        if not answer.prompt_tokens:
            answer.prompt_tokens = len(answer.prompt_ids) if answer.prompt_ids else usage.get("prompt_tokens", 0)
    return answers


def _openai_choice(request: CapturedRequest, choice: dict[str, Any], version: str | None,
                   top_prompt: Any) -> CapturedAnswer:
    ids = choice.get("token_ids")
    known = _int_list(ids)
    ids = list(ids) if known else (_logprob_token_ids(choice.get("logprobs")) or [])
    known = known or bool(ids)
    logprobs = _openai_logprobs(choice.get("logprobs"))
    if request.kind == "chat":
        message = choice.get("message") or {}
        text = message.get("content") or ""
        calls = [{"name": (c.get("function") or {}).get("name", ""), "arguments": (c.get("function") or {}).get(
            "arguments", "")} for c in message.get("tool_calls") or []]
    else:
        text, calls = choice.get("text") or "", []
    prompt = choice.get("prompt_token_ids") if _int_list(choice.get("prompt_token_ids")) else top_prompt
    stop_reason = choice.get("stop_reason", choice.get("matched_stop"))
    return CapturedAnswer(output_ids=ids, logprobs=logprobs, text=text,
                          finish_reason=_openai_finish(choice.get("finish_reason"), stop_reason, ids, len(ids)),
                          weight_version=version, completion_tokens=len(ids), ids_known=known,
                          prompt_ids=list(prompt) if _int_list(prompt) else None, tool_calls=calls)


# -- streams -------------------------------------------------------------------------------
class StreamAssembler:
    """Builds a stream's answers from its events as they pass (SSE `data:` lines), with their timing.

    SGLang streams are cumulative by default and deltas with `--incremental-streaming-output`; a chunk's
    `completion_tokens` (cumulative in both) tells which, and also mends SGLang's abort chunk that carries only
    the last id. OpenAI chunks are deltas. An in-band `{"error":...}` event answers every generation.
    """

    def __init__(self, request: CapturedRequest, started: float) -> None:
        self.request = request
        self.started = started
        self._buffer = b""
        self._answers = [CapturedAnswer(logprobs=[] if request.wants_logprobs else None)
                         for _ in request.inputs]
        self._first_token: list[float | None] = [None] * len(request.inputs)
        self._ids_seen = [False] * len(request.inputs)  # OpenAI: some chunk of the choice carried token ids
        self._last = started
        self._problem: CapturedError | None = None
        self.done = False

    def feed(self, chunk: bytes, now: float) -> None:
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")  # SSE lines may end in CRLF
        self._last = now
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), now)

    def _event(self, data: bytes, now: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            body = msgspec.json.decode(data)
        except msgspec.DecodeError as error:
            self._problem = CapturedError(502, f"unreadable stream event: {error}")
            return
        if isinstance(body, dict) and "error" in body and "choices" not in body and "meta_info" not in body:
            error = body["error"]
            code = error.get("code") if isinstance(error, dict) else None
            status = code if isinstance(code, int) and 400 <= code <= 599 else 400
            self._problem = CapturedError(status, error_message(data), data[:BODY_KEPT].decode("utf-8", "replace"))
            return
        try:
            if self.request.api == "native":
                self._native_event(body, now)
            else:
                self._openai_event(body, now)
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as error:
            self._problem = CapturedError(502, f"unexpected stream event shape: {error!r}")

    def _native_event(self, item: dict[str, Any], now: float) -> None:
        index = item.get("index", 0) if len(self.request.inputs) > 1 else 0
        answer = self._answers[index]
        meta = item["meta_info"]
        count = meta.get("completion_tokens")
        ids = item.get("output_ids")
        pairs = meta.get("output_token_logprobs")
        if ids is None and pairs is not None:
            ids = [pair[1] for pair in pairs]
        if ids is not None:
            cumulative = count is None or len(ids) == count and count >= len(answer.output_ids)
            answer.output_ids = _merge(answer.output_ids, list(ids), count, cumulative)
            if pairs is not None and answer.logprobs is not None:
                answer.logprobs = _merge(answer.logprobs, [p[0] for p in pairs], count, cumulative)
            text = item.get("text") or ""
            # cumulative text (the default, and SGLang's abort chunk, whose ids are not) starts with what came before
            whole = cumulative or len(text) >= len(answer.text) > 0 and text.startswith(answer.text)
            answer.text = text if whole else answer.text + text
        else:
            answer.ids_known = False
            answer.text = item.get("text") or answer.text
        if (count or answer.output_ids) and self._first_token[index] is None:
            self._first_token[index] = now
        answer.finish_reason = meta.get("finish_reason") or answer.finish_reason
        answer.weight_version = meta.get("weight_version", answer.weight_version)
        answer.prompt_tokens = meta.get("prompt_tokens", answer.prompt_tokens) or 0
        answer.cached_tokens = meta.get("cached_tokens", answer.cached_tokens) or 0
        answer.completion_tokens = count if count is not None else len(answer.output_ids)

    def _openai_event(self, body: dict[str, Any], now: float) -> None:
        version = (body.get("metadata") or {}).get("weight_version")
        if _int_list(body.get("prompt_token_ids")):
            for answer in self._answers:
                answer.prompt_ids = list(body["prompt_token_ids"])
        for choice in body.get("choices") or []:
            index = choice.get("index", 0)
            answer = self._answers[index]
            ids = choice.get("token_ids")
            if not _int_list(ids):
                ids = _logprob_token_ids(choice.get("logprobs"))
            if ids:
                answer.output_ids.extend(ids)
                self._ids_seen[index] = True
            if _int_list(choice.get("prompt_token_ids")):
                answer.prompt_ids = list(choice["prompt_token_ids"])
            values = _openai_logprobs(choice.get("logprobs"))
            if values is not None and answer.logprobs is not None:
                answer.logprobs.extend(values)
            delta = choice.get("delta") if self.request.kind == "chat" else None
            text = (delta or {}).get("content") if delta is not None else choice.get("text")
            if text:
                answer.text += text
            for call in (delta or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                answer.tool_calls.append({"name": function.get("name", ""), "arguments": function.get("arguments", "")})
            if (text or ids) and self._first_token[index] is None:
                self._first_token[index] = now
            if choice.get("finish_reason") is not None:
                stop = choice.get("stop_reason", choice.get("matched_stop"))
                answer.finish_reason = _openai_finish(choice["finish_reason"], stop, answer.output_ids,
                                                      len(answer.output_ids))
            if version is not None:
                answer.weight_version = version

    def answers(self) -> list[CapturedAnswer]:
        """The answers as far as the stream went; a stream that ended without a finish is an abort."""
        if self._problem is not None:
            elapsed = self._last - self.started
            return [CapturedAnswer(error=self._problem, ttft=elapsed, total=elapsed) for _ in self.request.inputs]
        for index, answer in enumerate(self._answers):
            if self.request.api == "openai" and not self._ids_seen[index] and answer.text:
                answer.ids_known = False  # text came, no chunk carried its ids (SGLang, or no return_token_ids)
            if not answer.ids_known:
                answer.output_ids = []
            answer.completion_tokens = len(answer.output_ids)
            if answer.logprobs is not None and len(answer.logprobs) != len(answer.output_ids):
                answer.logprobs_dropped = bool(answer.logprobs)
                answer.logprobs = None  # none sent (or not one per token): a trace keeps no partial logprobs
            if answer.finish_reason is None:
                answer.finish_reason = {"type": "abort", "message": "stream ended without a finish reason"}
            first = self._first_token[index]
            answer.total = max(0.0, self._last - self.started)
            answer.ttft = min(answer.total, max(0.0, (first if first is not None else self._last) - self.started))
        return self._answers


def _merge(held: list[Any], chunk: list[Any], count: int | None, cumulative: bool) -> list[Any]:
    """Combine a stream chunk with what the earlier chunks gave (see `StreamAssembler`)."""
    if cumulative:
        return chunk
    if count is not None and len(held) >= count:
        return held[:count]  # SGLang's abort chunk repeats only the last id
    if count is not None and len(held) + len(chunk) > count:
        return held + chunk[len(held) + len(chunk) - count:]
    return held + chunk
