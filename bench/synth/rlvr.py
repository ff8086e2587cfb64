"""`rlvr` traces: single-turn math word problems, sampled in GRPO groups.

Each prompt is a word problem with a known integer answer; each sample reasons for a
long-tailed number of tokens and ends with `\\boxed{...}`, right or wrong. Reward is 1.0
for the right answer. A few samples run past `max_new_tokens` and are cut (`length`).
"""

from __future__ import annotations

from typing import Iterator

from faker import Faker

from bench.tokenizer import ByteBPETokenizer
from bench.trace import Prompt, Request, Trajectory, Turn

from .common import GroupRandom, completion, sampling_params, sentences_of_about

SYSTEM = "Solve the problem step by step. Put the final answer in \\boxed{}."
MAX_NEW_TOKENS = 1024
DEFAULT_CONTEXT_LENGTH = 4096


def _problem(group: GroupRandom) -> tuple[str, int]:
    rng, fake = group.rng, group.fake
    name, item = fake.first_name(), rng.choice(["apples", "books", "coins", "stamps", "marbles", "tickets"])
    a, b, c = rng.randint(5, 500), rng.randint(1, 300), rng.randint(1, 200)
    form = rng.randrange(3)
    if form == 0:
        return f"{name} has {a} {item}, buys {b} more and gives {c} away. How many {item} are left?", a + b - c
    if form == 1:
        return f"A box holds {a} {item}. How many {item} are in {b} boxes?", a * b
    return f"{name} shares {a * b} {item} equally among {b} friends. How many does each friend get?", a


def rlvr_trajectories(
    tokenizer: ByteBPETokenizer,
    fake: Faker,
    *,
    seed: int,
    groups: int,
    group_size: int,
    groups_per_version: int = 16,
) -> Iterator[Trajectory]:
    for group_index in range(groups):
        group = GroupRandom.for_group(fake, seed, "rlvr", group_index)
        question, answer = _problem(group)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompt = Prompt(ids=tokenizer.encode(text), text=text, messages=messages)
        skill = group.rng.random()  # share of samples that get this problem right
        group_id = f"g{group_index:05d}"
        for member in range(group_size):
            correct = group.rng.random() < skill
            given = answer if correct else answer + group.rng.choice([-10, -2, -1, 1, 3, 7, 100])
            reasoning = sentences_of_about(group, tokenizer, group.lognormal_int(180, 0.8, 8, 3 * MAX_NEW_TOKENS))
            response = completion(
                tokenizer,
                group.rng,
                f"{reasoning} So the answer is \\boxed{{{given}}}.",
                max_new_tokens=MAX_NEW_TOKENS,
                prompt_tokens=len(prompt.ids),
                cached_tokens=0 if member == 0 else len(prompt.ids) - 1,
                weight_version=str(group_index // groups_per_version),
                tail=0.01,
            )
            finished = response.finish_reason is not None and response.finish_reason["type"] == "stop"
            yield Trajectory(
                id=f"{group_id}-{member}",
                group_id=group_id,
                prompt=prompt,
                turns=[Turn(request=Request(endpoint="/generate",
                                            sampling_params=sampling_params(MAX_NEW_TOKENS, tokenizer.eos_token_id),
                                            input_ids_append=[]),
                            response=response)],
                reward=1.0 if finished and correct else 0.0,
                metadata={"answer": str(answer), "outcome": "completed" if finished else "truncated"},
            )
