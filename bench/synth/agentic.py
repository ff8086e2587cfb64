"""`agentic` traces: SWE-bench-like multi-turn tool use.

An agent gets an issue report and a set of tools, then alternates model turns (a short
thought and one tool call) with tool outputs, for 5 to 50 turns. Tool output sizes are
long-tailed and a few approach or exceed the context budget; when the next request would
not fit, the recorded response is SGLang's context-length 400 and the trajectory ends.
Latencies are long-tailed too. Request ids are recorded as `input_ids_append`, and the
full context always decodes to exactly what the chat template renders for the same
conversation.
"""

from __future__ import annotations

import json
from typing import Iterator

from faker import Faker

from bench.tokenizer import ByteBPETokenizer
from bench.trace import Latency, Prompt, Request, Response, ResponseError, ToolCall, ToolOutput, Trajectory, Turn

from .common import GroupRandom, completion, sampling_params, sentences_of_about

DEFAULT_CONTEXT_LENGTH = 8192
MAX_TURN_TOKENS = 2048
HUGE_OUTPUT_SHARE = 0.005
DEFAULT_TOOL_OUTPUT_TOKENS = 60
SYSTEM = "You are a software engineering agent. Find and fix the bug the user reports, then stop."

TOOLS = [
    {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, description, arg in [
        ("bash", "Run a shell command in the repository.", "command"),
        ("view_file", "Show a file with line numbers.", "path"),
        ("search", "Search the repository for a pattern.", "pattern"),
    ]
]


def _issue(group: GroupRandom) -> str:
    fake = group.fake
    module = fake.file_path(depth=2, extension="py")
    return (
        f"Issue in {fake.user_name()}/{fake.word()}: {fake.sentence(nb_words=10)}\n\n"
        f"Calling `{fake.word()}_{fake.word()}()` from {module} raises "
        f"{group.rng.choice(['KeyError', 'ValueError', 'TypeError', 'IndexError'])}. "
        f"{fake.paragraph(nb_sentences=3)}"
    )


def _tool_call(group: GroupRandom, turn: int) -> tuple[str, dict[str, str]]:
    fake, rng = group.fake, group.rng
    name = rng.choice(["bash", "bash", "view_file", "search"])
    if name == "bash":
        return name, {"command": rng.choice([f"python -m pytest tests/test_{fake.word()}.py -x",
                                              f"ls {fake.file_path(depth=2).rsplit('/', 1)[0]}",
                                              f"git diff HEAD~{turn % 5 + 1}"])}
    if name == "view_file":
        return name, {"path": fake.file_path(depth=3, extension="py")}
    return name, {"pattern": f"def {fake.word()}_{fake.word()}"}


def _output_lines(group: GroupRandom) -> Iterator[str]:
    fake, rng = group.fake, group.rng
    while True:
        kind = rng.random()
        if kind < 0.4:
            yield f"{fake.file_path(depth=3, extension='py')}:{rng.randint(1, 999)}: {fake.word()} = {fake.word()}({fake.word()})"
        elif kind < 0.7:
            yield f"    {fake.word()}_{fake.word()} = self.{fake.word()}.get('{fake.word()}', {rng.randint(0, 99)})"
        elif kind < 0.9:
            yield f"FAILED tests/test_{fake.word()}.py::test_{fake.word()} - AssertionError: {rng.randint(0, 99)} != {rng.randint(0, 99)}"
        else:
            yield fake.sentence(nb_words=12)


def _tool_output_text(group: GroupRandom, tokenizer: ByteBPETokenizer, tokens: int) -> str:
    lines: list[str] = []
    count = 0
    for line in _output_lines(group):
        if count >= tokens:
            break
        lines.append(line)
        count += len(tokenizer.encode(line)) + 1
    return "\n".join(lines)


def _tool_output_tokens(group: GroupRandom, context_length: int, median: int = 60) -> int:
    if group.rng.random() < HUGE_OUTPUT_SHARE:
        return round(context_length * group.rng.uniform(0.6, 1.3))
    return group.lognormal_int(median, 1.1, 5, context_length // 4)


def _context_error(prompt_tokens: int, context_length: int, weight_version: str) -> Response:
    message = (f"The input ({prompt_tokens} tokens) is longer than the model's context length "
               f"({context_length} tokens).")
    return Response(output_ids=[], logprobs=None, text="", finish_reason=None, weight_version=weight_version,
                    prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0,
                    latency=Latency(ttft=0.002, total=0.002), error=ResponseError(status=400, message=message))


def agentic_trajectories(
    tokenizer: ByteBPETokenizer,
    fake: Faker,
    *,
    seed: int,
    groups: int,
    group_size: int,
    context_length: int = DEFAULT_CONTEXT_LENGTH,
    groups_per_version: int = 16,
    turns: int | None = None,
    tool_output_tokens: int = DEFAULT_TOOL_OUTPUT_TOKENS,
) -> Iterator[Trajectory]:
    """`turns` fixes every trajectory's planned turns (default: long-tailed, 5-50); `tool_output_tokens` is the
    median tool output (long-tailed around it). Both exist to make traces of a given shape and size (the trace
    loading benchmark's 500x20 turns); the defaults draw exactly what they always drew."""
    eos = tokenizer.eos_token_id
    for group_index in range(groups):
        group = GroupRandom.for_group(fake, seed, "agentic", group_index)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _issue(group)}]
        text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
        prompt = Prompt(ids=tokenizer.encode(text), text=text, messages=messages, tools=TOOLS)
        group_id = f"g{group_index:05d}"
        version = str(group_index // groups_per_version)
        for member in range(group_size):
            yield _trajectory(tokenizer, group, prompt, f"{group_id}-{member}", group_id, version,
                              member, context_length, eos, turns, tool_output_tokens)


def _trajectory(
    tokenizer: ByteBPETokenizer,
    group: GroupRandom,
    prompt: Prompt,
    trajectory_id: str,
    group_id: str,
    version: str,
    member: int,
    context_length: int,
    eos: int,
    fixed_turns: int | None = None,
    tool_output_tokens: int = DEFAULT_TOOL_OUTPUT_TOKENS,
) -> Trajectory:
    drawn = group.lognormal_int(10, 0.6, 5, 50)  # drawn either way: a fixed count leaves the other draws alone
    planned = drawn if fixed_turns is None else fixed_turns
    context = len(prompt.ids)
    cached = 0 if member == 0 else context - 1
    append: list[int] = []
    turns: list[Turn] = []
    outcome = "completed"
    for turn_index in range(planned):
        input_tokens = context + len(append)
        if input_tokens >= context_length:
            request = Request(endpoint="/generate", sampling_params=sampling_params(MAX_TURN_TOKENS, eos),
                              input_ids_append=append)
            turns.append(Turn(request=request, response=_context_error(input_tokens, context_length, version)))
            outcome = "context_overflow"
            break
        max_new = min(MAX_TURN_TOKENS, context_length - input_tokens)
        final = turn_index == planned - 1
        thought = sentences_of_about(group, tokenizer, group.lognormal_int(30, 0.9, 4, 3 * MAX_TURN_TOKENS))
        calls: list[ToolCall] = []
        if not final:
            name, arguments = _tool_call(group, turn_index)
            calls.append(ToolCall(id=f"call_{turn_index}", name=name, arguments=json.dumps(arguments)))
            thought += "".join(
                f'\n<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>' for c in calls
            )
        response = completion(tokenizer, group.rng, thought, max_new_tokens=max_new, prompt_tokens=input_tokens,
                              cached_tokens=cached, weight_version=version, tail=0.03)
        request = Request(endpoint="/generate", sampling_params=sampling_params(max_new, eos), input_ids_append=append)
        if response.finish_reason is not None and response.finish_reason["type"] == "length":
            turns.append(Turn(request=request, response=response))
            outcome = "truncated"
            break
        outputs = []
        for call in calls:
            out_text = _tool_output_text(group, tokenizer, _tool_output_tokens(group, context_length,
                                                                                    tool_output_tokens))
            outputs.append(ToolOutput(call_id=call.id, text=out_text, bytes=len(out_text.encode("utf-8")),
                                      tokens=len(tokenizer.encode(out_text))))
        turns.append(Turn(request=request, response=response, tool_calls=calls, tool_outputs=outputs))
        context = input_tokens + len(response.output_ids)
        cached = context
        append = tokenizer.encode("".join(
            f"\n<|im_start|>user\n<tool_response>\n{out.text}\n</tool_response><|im_end|>" for out in outputs
        ) + "\n<|im_start|>assistant\n")
    solved = outcome == "completed" and group.rng.random() < 0.35
    return Trajectory(id=trajectory_id, group_id=group_id, prompt=prompt, turns=turns,
                      reward=1.0 if solved else 0.0, metadata={"outcome": outcome, "planned_turns": planned})
