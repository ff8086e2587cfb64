"""The fixed group pattern (seed mode 000), applied at run time to slime's or miles' real rollout module.

Unfixed, `generate_and_rm_group` gathers its samples' `generate_and_rm` tasks bare: one
sample raising after its reply came back (a reward function or parser failing) propagates
out of the group, then out of `generate_rollout`; the siblings' tasks run on, orphaned, and
the whole rollout is lost.

The fix, in the same shape as the framework's function: gather with `return_exceptions=True`,
log the root cause, and keep an ABORTED placeholder of the same fan-out shape in place of the
sample that raised (one masked token, reward 0, `remove_sample`), so the group keeps
`n_samples_per_prompt` members and the rollout goes on.

`fixed_group(module)` swaps the module's `generate_and_rm_group` for the fixed one while a run
lasts and puts the original back; the rest of the module (the rollout loop that submits
groups by that module-level name, `generate_and_rm`, `GenerateState`) is the framework's own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import contextmanager
from dataclasses import asdict, fields
from types import ModuleType
from typing import Any, Awaitable, Callable, Iterator

from bench.records.sample import ErrorInfo

log = logging.getLogger(__name__)

ERROR_KEY = "rollout_bench_error"  # `Sample.metadata` entry: the exception a placeholder stands for

GroupFunction = Callable[..., Awaitable[list[Any]]]


Render = Callable[[Any], "list[int] | None"]  # the prompt ids a framework's generate renders for a sample, if its own


def fixed_generate_and_rm_group(module: ModuleType, render: Render | None = None) -> GroupFunction:
    """`generate_and_rm_group(args, group, sampling_params, evaluation=False)` that survives a raising sample.
    `render` gives the prompt the framework's generate sends, when it renders its own (slime's retool example):
    the placeholder then holds that prompt, as a sample of that generate would."""

    async def generate_and_rm_group(args: Any, group: list[Any], sampling_params: dict[str, Any],
                                    evaluation: bool = False) -> list[Any]:
        state = module.GenerateState(args)
        if state.aborted:
            return group
        for sample in group:
            if sample.session_id is None:
                sample.session_id = str(uuid.uuid4())
        tasks = []
        for position, sample in enumerate(group):
            params = sampling_params.copy()
            if getattr(args, "sglang_enable_deterministic_inference", False):
                params["sampling_seed"] = state.group_sampling_seeds[position]
            tasks.append(asyncio.create_task(module.generate_and_rm(args, sample, params, evaluation=evaluation)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        fanned_out = any(isinstance(result, list) for result in results)
        out: list[Any] = []
        for sample, result in zip(group, results):
            if isinstance(result, BaseException):
                log.error("sample %s of group %s raised; keeping an ABORTED placeholder in its place",
                          sample.index, sample.group_index, exc_info=result)
                stand_in = placeholder(args, state.tokenizer, sample, result, render)
                out.append([stand_in] if fanned_out else stand_in)
            else:
                out.append(result)
        if not state.aborted and args.group_rm:
            rewards = await module.batched_async_rm(args, out)
            for sample, reward in zip(out, rewards):
                sample.reward = reward
        return out

    generate_and_rm_group.__qualname__ = f"fixed {module.__name__}.generate_and_rm_group"
    return generate_and_rm_group


def placeholder(args: Any, tokenizer: Any, sample: Any, error: BaseException, render: Render | None = None) -> Any:
    """A new ABORTED sample for `sample`'s prompt: one masked token, zero reward, the error kept in its metadata."""
    sample_class = type(sample)
    known = {f.name for f in fields(sample_class)}
    kept = {name: getattr(sample, name) for name in ("group_index", "index", "prompt", "label", "session_id",
                                                     "multimodal_inputs", "generate_function_path") if name in known}
    stand_in = sample_class(**kept)
    stand_in.metadata = {**(sample.metadata or {}), ERROR_KEY: asdict(ErrorInfo.of(error))}
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    rendered = render(sample) if render is not None else None
    stand_in.tokens = (list(rendered) if rendered is not None else prompt_ids(tokenizer, sample)) + [pad]
    stand_in.response = ""
    stand_in.response_length = 1
    stand_in.loss_mask = [0]
    stand_in.rollout_log_probs = [0.0]
    stand_in.reward = {args.reward_key: 0.0} if args.reward_key else 0.0
    stand_in.status = sample_class.Status.ABORTED
    if "remove_sample" in known:
        stand_in.remove_sample = True
    return stand_in


def prompt_ids(tokenizer: Any, sample: Any) -> list[int]:
    """The sample's prompt tokens: from its token list if it got that far, else from its prompt."""
    tokens = list(sample.tokens or [])
    if tokens and len(tokens) > sample.response_length:
        return tokens[: len(tokens) - sample.response_length]
    if isinstance(sample.prompt, str):
        return list(tokenizer.encode(sample.prompt, add_special_tokens=False))
    tools = (sample.metadata or {}).get("tools")
    return list(tokenizer.apply_chat_template(sample.prompt, tools=tools, tokenize=True, add_generation_prompt=True,
                                              return_dict=False))


@contextmanager
def fixed_group(module: ModuleType, render: Render | None = None) -> Iterator[None]:
    """Run with the fixed `generate_and_rm_group` in `module` (slime's or miles' `rollout.sglang_rollout`)."""
    original = module.generate_and_rm_group
    module.generate_and_rm_group = fixed_generate_and_rm_group(module, render)
    try:
        yield
    finally:
        module.generate_and_rm_group = original
