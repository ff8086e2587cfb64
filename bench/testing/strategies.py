"""Hypothesis strategies for traces and fault plans (needs the `test` extra: hypothesis).

Two kinds of trace records:
- `trajectories()` / `trace_headers()`: records that pass every *format* check, with every
  optional part exercised (random ids and texts), for tests of trace I/O;
- `consistent_trajectories()` / `traces()`: records that are also *consistent with the
  shipped tokenizer* (every text is what its ids decode to, each turn's request is the
  previous context plus the tool message the chat template renders), so the mock server can
  replay them to real rollout code without drift.

Fault rules and plans come from `faults.strategies`, re-exported here (`rules`, `plans`,
`sub_plans`, ...), so a test can import every strategy from one place.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from bench.synth.common import sampling_params
from bench.tokenizer import TOKENIZER_NAME, load_tokenizer
from bench.trace import (SCHEMA_VERSION, Latency, Prompt, Request, Response, ResponseError, TokenizerInfo, ToolCall,
                         ToolOutput, TraceHeader, TraceSource, TraceWriter, Trajectory, Turn)
from faults.strategies import fault_names, fault_params, faults, plans, rule_values, rules, schedule_values, sub_plans

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


# --- traces consistent with the shipped tokenizer -------------------------------------------

TOOL_NAMES = ("bash", "view_file", "search")
# Words without "<": the chat markup (`<|im_end|>`, `<tool_call>`) must come only from the template.
_ASCII = string.ascii_letters + string.digits + " .,:;!?'()[]{}=+-*/_#\n"
words = (st.text(_ASCII, min_size=1, max_size=10)
         | st.text(st.characters(codec="utf-8", exclude_characters="<\r", exclude_categories=("Cs", "Cc")),
                   min_size=1, max_size=6))
prose = st.lists(words, min_size=1, max_size=12).map(" ".join)
# Strictly negative: an all-zero row is what the token_alignment invariant flags as zero-filled.
logprob_values = st.floats(-20.0, -0.0001, allow_nan=False).map(lambda x: min(-0.0001, round(x, 4)))


@st.composite
def prompts(draw: st.DrawFn, *, tools: bool = True) -> Prompt:
    """A system + user conversation rendered by the chat template; ids are its tokenization."""
    messages = [{"role": "system", "content": draw(prose)}, {"role": "user", "content": draw(prose)}]
    schemas = [{"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}
        for name in TOOL_NAMES] if tools else None
    text = _TOKENIZER.apply_chat_template(messages, tools=schemas, add_generation_prompt=True)
    return Prompt(ids=_TOKENIZER.encode(text), text=text, messages=messages, tools=schemas)


@st.composite
def consistent_trajectories(draw: st.DrawFn, *, trajectory_id: str = "g00000-0", group_id: str = "g00000",
                            prompt: Prompt | None = None, max_turns: int = 3, max_new_tokens: int = 96,
                            context_length: int = 8192) -> Trajectory:
    """A multi-turn tool-use trajectory that the server replays exactly for the shipped tokenizer.

    Each turn's response is `encode(text) + [EOS]` (cut at `max_new_tokens` with finish
    `length`, text re-derived from the kept ids); every turn but the last calls one tool, and
    the next request appends the tool message exactly as the chat template renders it.
    """
    prompt = prompt if prompt is not None else draw(prompts())
    planned = draw(st.integers(1, max_turns))
    context, append, turns = len(prompt.ids), [], []
    for index in range(planned):
        final = index == planned - 1
        text = draw(prose)
        calls = [] if final else [ToolCall(id=f"call_{index}", name=draw(st.sampled_from(TOOL_NAMES)),
                                           arguments=json.dumps({"arg": draw(prose)}))]
        text += "".join(f'\n<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'
                        for c in calls)
        input_tokens = context + len(append)
        budget = min(max_new_tokens, context_length - input_tokens)
        if budget <= 0:
            break
        ids = _TOKENIZER.encode(text) + [EOS]
        finish: dict[str, Any] = {"type": "stop", "matched": EOS}
        if len(ids) > budget:
            ids, finish = ids[:budget], {"type": "length", "length": budget}
            text, calls = _TOKENIZER.decode(ids), []
        ttft = draw(st.floats(0.001, 0.5).map(lambda x: round(x, 4)))
        response = Response(output_ids=ids, logprobs=draw(st.lists(logprob_values, min_size=len(ids),
                                                                   max_size=len(ids))),
                            text=text, finish_reason=finish, weight_version="0", prompt_tokens=input_tokens,
                            completion_tokens=len(ids), cached_tokens=0,
                            latency=Latency(ttft=ttft, total=round(ttft + 0.001 * len(ids), 4)))
        outputs = [ToolOutput(call_id=c.id, text=out, bytes=len(out.encode()), tokens=len(_TOKENIZER.encode(out)))
                   for c in calls for out in [draw(prose)]]
        request = Request(endpoint="/generate", sampling_params=sampling_params(budget, EOS), input_ids_append=append)
        turns.append(Turn(request=request, response=response, tool_calls=calls, tool_outputs=outputs))
        if finish["type"] == "length" or not calls:
            break
        context = input_tokens + len(ids)
        append = _TOKENIZER.encode("".join(
            f"\n<|im_start|>user\n<tool_response>\n{out.text}\n</tool_response><|im_end|>" for out in outputs
        ) + "\n<|im_start|>assistant\n")
    if not turns:  # the prompt alone fills the context: keep one turn so the record is valid
        raise ValueError(f"prompt of {len(prompt.ids)} tokens leaves no room in a context of {context_length}")
    return Trajectory(id=trajectory_id, group_id=group_id, prompt=prompt, turns=turns,
                      reward=draw(st.sampled_from([0.0, 1.0])), metadata={})


@dataclass(frozen=True)
class DrawnTrace:
    """A header and its trajectories, ready to write and replay."""

    header: TraceHeader
    trajectories: list[Trajectory]

    def write(self, path: str | Path) -> Path:
        with TraceWriter(path, self.header) as writer:
            for trajectory in self.trajectories:
                writer.write(trajectory)
        return Path(path)


def consistent_header(context_length: int = 8192) -> TraceHeader:
    """The header of a trace in the shipped tokenizer, as `rollout-bench synth` writes it."""
    return TraceHeader(schema_version=SCHEMA_VERSION,
                       source=TraceSource(kind="synthetic", generator="bench.testing.strategies.traces"),
                       model="rollout-bench/drawn",
                       tokenizer=TokenizerInfo(name=TOKENIZER_NAME, vocab_size=VOCAB_SIZE, eos_token_id=EOS,
                                               pad_token_id=_TOKENIZER.pad_token_id),
                       context_length=context_length, created="2026-01-01T00:00:00Z")


@st.composite
def traces(draw: st.DrawFn, *, max_groups: int = 3, max_group_size: int = 4, max_turns: int = 3,
           context_length: int = 8192) -> DrawnTrace:
    """Whole traces: GRPO groups whose members share a prompt, ids `g00000-0`, `g00000-1`, ..."""
    out: list[Trajectory] = []
    for group_index in range(draw(st.integers(1, max_groups))):
        group = f"g{group_index:05d}"
        prompt = draw(prompts())
        for member in range(draw(st.integers(1, max_group_size))):
            out.append(draw(consistent_trajectories(trajectory_id=f"{group}-{member}", group_id=group, prompt=prompt,
                                                    max_turns=max_turns, context_length=context_length)))
    return DrawnTrace(consistent_header(context_length), out)


__all__ = [
    "DrawnTrace", "consistent_header", "consistent_trajectories", "fault_names", "fault_params", "faults",
    "json_objects", "json_values", "plans", "prompts", "responses", "rule_values", "rules", "schedule_values",
    "sub_plans", "trace_headers", "traces", "trajectories", "turns",
]
