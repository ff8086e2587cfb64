"""`retool` traces: math problems solved with a code interpreter, in the shape slime's retool example sends them.

Each group is one word problem. The framework receives the raw question (`prompt.raw`) and renders its own
prompt (`prompt.ids`, `retool_format.render_prompt`). A sample writes one to three code-interpreter calls, each
answered by actually running its code the way retool's sandbox does, then `Answer: \\boxed{...}`, right or
wrong. Later requests append the tool's result in retool's `<interpreter>` wrapping, tokenized on its own as
retool tokenizes it. A few turns run past `max_new_tokens` and are cut (`length`): the sample ends there.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Iterator

from faker import Faker

from bench.tokenizer import ByteBPETokenizer
from bench.trace import Prompt, Request, ToolCall, ToolOutput, Trajectory, Turn

from . import retool_format
from .common import GroupRandom, completion, sampling_params, sentences_of_about

MAX_NEW_TOKENS = 512
DEFAULT_CONTEXT_LENGTH = 4096
ITEMS = ["apples", "books", "coins", "stamps", "marbles", "tickets"]


def _problem(group: GroupRandom) -> tuple[str, list[str]]:
    """A question and the programs that compute its answer (the first one straight, later ones double-checking)."""
    rng, fake = group.rng, group.fake
    name, item = fake.first_name(), rng.choice(ITEMS)
    a, b, c = rng.randint(5, 500), rng.randint(2, 300), rng.randint(1, 200)
    form = rng.randrange(4)
    if form == 0:
        return (f"{name} has {a} {item}, buys {b} more and gives {c} away. How many {item} are left?",
                [f"left = {a} + {b} - {c}\nprint(left)", f"print(sum([{a}, {b}, -{c}]))"])
    if form == 1:
        return (f"A box holds {a} {item}. How many {item} are in {b} boxes?",
                [f"print({a} * {b})", f"total = 0\nfor box in range({b}):\n    total += {a}\nprint(total)"])
    if form == 2:
        return (f"{name} shares {a * b} {item} equally among {b} friends. How many does each friend get?",
                [f"print({a * b} // {b})", f"import fractions\nprint(fractions.Fraction({a * b}, {b}))"])
    return (f"What is the greatest common divisor of {a * c} and {b * c}?",
            [f"import math\nprint(math.gcd({a * c}, {b * c}))",
             f"x, y = {a * c}, {b * c}\nwhile y:\n    x, y = y, x % y\nprint(x)"])


@lru_cache(maxsize=4096)
def _result(code: str) -> str:
    return retool_format.run_code(code)


def _answer_of(result: str) -> str:
    return result.removeprefix("Output:\n").strip()


def retool_trajectories(
    tokenizer: ByteBPETokenizer,
    fake: Faker,
    *,
    seed: int,
    groups: int,
    group_size: int,
    context_length: int = DEFAULT_CONTEXT_LENGTH,
    groups_per_version: int = 16,
) -> Iterator[Trajectory]:
    for group_index in range(groups):
        group = GroupRandom.for_group(fake, seed, "retool", group_index)
        question, programs = _problem(group)
        text = retool_format.render_prompt(question)
        prompt = Prompt(ids=tokenizer.encode(text), text=text, tools=retool_format.TOOLS, raw=question)
        skill = group.rng.random()
        group_id = f"g{group_index:05d}"
        for member in range(group_size):
            yield _trajectory(tokenizer, group, prompt, programs, skill, f"{group_id}-{member}", group_id,
                              str(group_index // groups_per_version), member, context_length)


def _trajectory(tokenizer: ByteBPETokenizer, group: GroupRandom, prompt: Prompt, programs: list[str], skill: float,
                trajectory_id: str, group_id: str, version: str, member: int, context_length: int) -> Trajectory:
    rng = group.rng
    calls_planned = rng.choice([1, 1, 2, 2, 3])
    context = len(prompt.ids)
    cached = 0 if member == 0 else context - 1
    append: list[int] = []
    turns: list[Turn] = []
    outcome = "completed"
    answer = ""
    correct = rng.random() < skill
    for turn_index in range(calls_planned + 1):
        input_tokens = context + len(append)
        max_new = min(MAX_NEW_TOKENS, context_length - input_tokens)
        final = turn_index == calls_planned
        thought = sentences_of_about(group, tokenizer, group.lognormal_int(40, 1.2, 4, 3 * MAX_NEW_TOKENS))
        calls: list[ToolCall] = []
        code = programs[min(turn_index, len(programs) - 1)]
        if final:
            given = answer if correct else str(int(answer or 0) + rng.choice([-10, -2, -1, 1, 3, 7, 100]))
            thought += " " + retool_format.answer_text(given)
        else:
            calls.append(ToolCall(id=f"call_{turn_index}", name=retool_format.TOOL_NAME,
                                  arguments=json.dumps({retool_format.CODE_ARGUMENT: code})))
            thought += "\n" + retool_format.tool_call_text(code)
        response = completion(tokenizer, rng, thought, max_new_tokens=max_new, prompt_tokens=input_tokens,
                              cached_tokens=cached, weight_version=version, tail=0.03)
        request = Request(endpoint="/generate", sampling_params=sampling_params(max_new, tokenizer.eos_token_id),
                          input_ids_append=append)
        if response.finish_reason is not None and response.finish_reason["type"] == "length":
            turns.append(Turn(request=request, response=response))
            outcome = "truncated"
            break
        outputs = []
        for call in calls:
            result = _result(code)
            answer = answer or _answer_of(result)
            outputs.append(ToolOutput(call_id=call.id, text=result, bytes=len(result.encode("utf-8")),
                                      tokens=len(tokenizer.encode(result))))
        turns.append(Turn(request=request, response=response, tool_calls=calls, tool_outputs=outputs))
        context = input_tokens + len(response.output_ids)
        cached = context
        append = tokenizer.encode("".join(retool_format.observation(out.text) for out in outputs))
    solved = outcome == "completed" and correct
    return Trajectory(id=trajectory_id, group_id=group_id, prompt=prompt, turns=turns, reward=1.0 if solved else 0.0,
                      metadata={"outcome": outcome, "answer": answer, "planned_turns": calls_planned + 1})
