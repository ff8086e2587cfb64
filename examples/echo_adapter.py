"""A complete target adapter: single-turn rollouts over SGLang's native /generate, as RL rollout code writes them.

    rollout-bench run --target echo_adapter:EchoRollout:unfixed --trace rlvr-500 --n 40 \\
        --fault missing_logprobs:p=0.25 --target-option reward=0.5
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import aiohttp

from bench import TRAJECTORY_HEADER, Emit, ErrorInfo, RolloutJob, SampleRecord, TrajectorySpec


class EchoRollout:
    variants = ("unfixed", "fixed")  # `--target echo_adapter:EchoRollout:fixed` calls EchoRollout("fixed")
    fail_fast = False  # one failed trajectory does not end the batch: the bench checks the others come back

    def __init__(self, variant: str = "unfixed") -> None:
        if variant not in self.variants:
            raise ValueError(f"EchoRollout has variants {', '.join(self.variants)}, not {variant!r}")
        self.fixed = variant == "fixed"
        self.name = f"echo:{variant}"  # what every report calls this target

    def warm_up(self, options: dict[str, Any]) -> None:
        """Slow imports belong here: the worker runs this while the bench loads the trace. Start no threads,
        pools or runtimes (Ray) here: a warm worker forks after warm-up, and they would not survive the fork."""
        import aiohttp.client  # noqa: F401

    def framework_info(self) -> dict[str, str]:
        """The code the report judged: an installed version, or a checkout and its commit."""
        return {"framework": "aiohttp", "version": importlib.metadata.version("aiohttp")}

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        reward = float(job.options.get("reward", 1.0))  # `--target-option reward=0.5`
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            async def one(spec: TrajectorySpec) -> None:
                async with limit:
                    emit(await self.sample(http, job.base_url, spec, reward))

            await asyncio.gather(*(one(spec) for spec in job.trajectories))

    async def sample(self, http: aiohttp.ClientSession, base_url: str, spec: TrajectorySpec,
                     reward: float) -> SampleRecord:
        body = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
        # Naming the trajectory makes every fault decision exact, whatever the concurrency.
        async with http.post(f"{base_url}/generate", json=body, headers={TRAJECTORY_HEADER: spec.id}) as reply:
            if reply.status != 200:
                return SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                                    error=ErrorInfo(f"HTTP {reply.status}", await reply.text(), ""))
            answer = await reply.json()
        meta = answer["meta_info"]
        if meta.get("output_token_logprobs") is None:  # the answer lacks the logprobs the trainer needs
            if self.fixed:
                return SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                                    error=ErrorInfo("MissingLogprobs", "no output_token_logprobs", ""))
            triples = [(0.0, token, None) for token in answer["output_ids"]]  # the bug: logprobs made up
        else:
            triples = meta["output_token_logprobs"]
        ids = [token for _, token, _ in triples]
        finish = meta["finish_reason"]["type"]
        return SampleRecord(spec.id, spec.group, "truncated" if finish == "length" else "completed", status=finish,
                            prompt_length=len(spec.prompt_ids), response_ids=ids,
                            logprobs=[logprob for logprob, _, _ in triples], loss_mask=[1] * len(ids),
                            response_length=len(ids), reward=reward, request_ids=[meta["id"]],
                            weight_versions=[str(meta["weight_version"])] if "weight_version" in meta else [])
