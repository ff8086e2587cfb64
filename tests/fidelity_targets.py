"""Plug-in targets whose requests leave the recording, as a user's own rollout code can."""

from __future__ import annotations

from typing import Any

import aiohttp

from bench import TRAJECTORY_HEADER, Emit, RolloutJob, SampleRecord, TrajectorySpec
from bench.targets.client import output_of
from bench.tokenizer import ByteBPETokenizer

SYSTEM = "<|im_start|>system\nYou are a careful solver.<|im_end|>\n"
OWN_TOOL_TEXT = "\n<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


class OwnLoop:
    """A multi-turn loop that renders its own conversation, as real slime's retool example does.

    Options: `own_prompt` (default true) puts its own system line before the trace's prompt;
    `named` (default true) names the trajectory in the bench's header (else the server only has
    the tokens); `turns` (default 3) requests per trajectory. After each reply it appends its own
    tool text, never the recorded tool output.
    """

    name = "tests:own-loop"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        tokenizer = ByteBPETokenizer.from_folder(job.tokenizer_path)
        options = job.options
        system = tokenizer.encode(SYSTEM) if options.get("own_prompt", True) else []
        turns = int(options.get("turns", 3))
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                context = system + list(spec.prompt_ids)
                for _ in range(turns):
                    budget = job.context_length - len(context)
                    if budget <= 0:
                        break
                    ids = await self._generate(http, job, spec, context, budget, bool(options.get("named", True)))
                    context += ids + tokenizer.encode(OWN_TOOL_TEXT)
                emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))

    @staticmethod
    async def _generate(http: aiohttp.ClientSession, job: RolloutJob, spec: TrajectorySpec, context: list[int],
                        budget: int, named: bool) -> list[int]:
        params: dict[str, Any] = dict(spec.sampling_params)
        params["max_new_tokens"] = min(int(params.get("max_new_tokens") or budget), budget)
        body = {"input_ids": context, "sampling_params": params, "return_logprob": True}
        headers = {TRAJECTORY_HEADER: spec.id} if named else {}
        async with http.post(f"{job.base_url}/generate", json=body, headers=headers) as reply:
            reply.raise_for_status()
            return output_of(await reply.json())[0]
