"""Hypothesis strategies for trace records (needs the `test` extra: hypothesis).

`trajectories()` draws records that pass every check of the trace format, so property
tests can write, read and replay them; `trace_headers()` draws matching headers.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .tokenizer import load_tokenizer
from .trace import (
    SCHEMA_VERSION,
    Latency,
    Prompt,
    Request,
    Response,
    ResponseError,
    TokenizerInfo,
    ToolCall,
    ToolOutput,
    TraceHeader,
    TraceSource,
    Trajectory,
    Turn,
)

_TOKENIZER = load_tokenizer()
VOCAB_SIZE = _TOKENIZER.vocab_size
EOS = _TOKENIZER.eos_token_id

texts = st.text(max_size=40)
json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(
    allow_nan=False, allow_infinity=False) | texts
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
json_objects: st.SearchStrategy[dict[str, Any]] = st.dictionaries(texts, json_values, max_size=4)
token_ids = st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=30)
seconds = st.floats(0, 1e4, allow_nan=False, allow_infinity=False)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]),
                                           "content": texts}), max_size=3)


def trace_headers(vocab_size: int = VOCAB_SIZE) -> st.SearchStrategy[TraceHeader]:
    return st.builds(
        TraceHeader,
        schema_version=st.integers(1, SCHEMA_VERSION),
        source=st.builds(TraceSource, kind=st.sampled_from(["synthetic", "recorded"]), generator=texts,
                         details=json_objects),
        model=texts,
        tokenizer=st.builds(TokenizerInfo, name=texts, vocab_size=st.just(vocab_size), eos_token_id=st.just(EOS),
                            pad_token_id=st.none() | st.integers(0, vocab_size - 1)),
        context_length=st.integers(1, 1 << 20),
        created=texts,
        metadata=json_objects,
    )


@st.composite
def responses(draw: st.DrawFn) -> Response:
    ttft = draw(seconds)
    latency = Latency(ttft=ttft, total=ttft + draw(seconds))
    if draw(st.integers(0, 9)) == 0:
        return Response(output_ids=[], logprobs=None, text="", finish_reason=None,
                        weight_version=draw(st.none() | texts), prompt_tokens=draw(st.integers(0, 10**6)),
                        completion_tokens=0, cached_tokens=0, latency=latency,
                        error=ResponseError(status=draw(st.integers(400, 599)), message=draw(texts)))
    ids = draw(token_ids)
    logprobs = draw(st.none() | st.lists(st.floats(-1e4, 0, allow_nan=False), min_size=len(ids), max_size=len(ids)))
    finish = draw(st.sampled_from([{"type": "stop", "matched": EOS}, {"type": "stop", "matched": "</answer>"},
                                   {"type": "length", "length": len(ids)},
                                   {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}]))
    return Response(output_ids=ids, logprobs=logprobs, text=draw(texts), finish_reason=finish,
                    weight_version=draw(st.none() | texts), prompt_tokens=0, completion_tokens=len(ids),
                    cached_tokens=draw(st.integers(0, 10**6)), latency=latency)


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    form = draw(st.sampled_from(["input_ids", "input_ids_append", "text", "messages"]))
    value = draw({"input_ids": token_ids, "input_ids_append": token_ids, "text": texts, "messages": messages}[form])
    request = Request(endpoint=draw(st.sampled_from(["/generate", "/v1/chat/completions", "/v1/completions"])),
                      sampling_params=draw(json_objects), **{form: value})
    calls = draw(st.lists(st.builds(ToolCall, id=texts, name=texts, arguments=texts), max_size=2,
                          unique_by=lambda call: call.id))
    outputs = [ToolOutput(call_id=call.id, text=text, bytes=len(text.encode()), tokens=draw(st.integers(0, 10**5)))
               for call in calls for text in [draw(texts)]]
    return Turn(request=request, response=draw(responses()), tool_calls=calls, tool_outputs=outputs)


def _fix_prompt_tokens(trajectory: Trajectory) -> Trajectory:
    """Set each response's `prompt_tokens` to what its request holds, as a server reports it."""
    for turn, ids in zip(trajectory.turns, trajectory.iter_request_input_ids()):
        if ids is not None and turn.response.error is None:
            turn.response.prompt_tokens = len(ids)
    return trajectory


def trajectories() -> st.SearchStrategy[Trajectory]:
    """Valid trajectories with every optional part exercised."""
    return st.builds(
        Trajectory,
        id=texts.filter(bool),
        group_id=texts.filter(bool),
        prompt=st.builds(Prompt, ids=token_ids, text=texts, messages=st.none() | messages,
                         tools=st.none() | st.lists(json_objects, max_size=2)),
        turns=st.lists(turns(), min_size=1, max_size=4),
        reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
        metadata=json_objects,
    ).map(_fix_prompt_tokens)
