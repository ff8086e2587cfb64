"""`areal`: AReaL's real rollout path (PyPI `areal`), in its own environment, against the bench server.

AReaL's `RemoteSGLangEngine` connects to the bench as to an SGLang server (one `GET /health`, then
`/generate` with input ids and logprobs), and its executor runs the real `RLVRWorkflow` per trajectory:
the prompt rendered from the trace's messages by AReaL's own chat-template call, the reward computed in
AReaL's process pool (`rewards.score`, which honours `raise_after_generate`), the result a dict of
`[1, L]` tensors. What the adapter adds is bookkeeping only, in a subclass that keeps AReaL's code: which
trajectory each result belongs to, the response's finish reason and versions, and the error a workflow
raised (AReaL logs it and hands back None).

Variant: `plain` (AReaL as shipped; no seed pattern of its own). The engine's per-token `versions` are
AReaL's own weight counter, not the server's `weight_version`: they go to `details`, not `weight_versions`.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
from typing import Any
from urllib.parse import urlparse

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob, TrajectorySpec

from . import rewards

VARIANTS = ("plain",)
DISTRIBUTION = "areal"
INDEX_KEY, REWARD_KEY = "bench_index", "bench_reward"


class ArealTarget:
    variants = VARIANTS
    fail_fast = False  # AReaL drops a failed episode (None) and goes on

    def __init__(self, variant: str = "plain") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"areal has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.name = f"areal:{variant}"

    def warm_up(self, options: dict[str, Any]) -> None:
        """torch, transformers and AReaL's engine (seconds); no thread or pool starts before the job."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import areal.engine.sglang_remote  # noqa: F401
        import areal.workflow.rlvr  # noqa: F401

    def framework_info(self) -> dict[str, str]:
        return {"framework": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION)}

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for record in await asyncio.to_thread(self._rollout, job):
            emit(record)

    def _rollout(self, job: RolloutJob) -> list[SampleRecord]:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
        from areal.engine.sglang_remote import RemoteSGLangEngine
        from transformers import AutoTokenizer

        from .workflow import Episodes, bench_workflow

        tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
        config = InferenceEngineConfig(backend="sglang:d1", tokenizer_path=str(job.tokenizer_path),
                                       max_concurrent_rollouts=job.concurrency, consumer_batch_size=1,
                                       max_head_offpolicyness=10**9)
        engine = RemoteSGLangEngine(config)
        address = urlparse(job.base_url)
        engine.initialize(addr=f"{address.hostname}:{address.port}")
        episodes = Episodes()
        try:
            workflows: dict[tuple[int, float], Any] = {}  # one per recorded (max_new_tokens, temperature)
            for index, spec in enumerate(job.trajectories):
                key = (int(spec.sampling_params.get("max_new_tokens", 256)),
                       float(spec.sampling_params.get("temperature", 1.0)))
                if key not in workflows:
                    gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=key[0], temperature=key[1])
                    workflows[key] = bench_workflow(rewards.PATH, gconfig, tokenizer, episodes)
                engine.submit({"messages": spec.messages, INDEX_KEY: index, REWARD_KEY: 1.0}, workflows[key])
            results = engine.wait(len(job.trajectories), timeout=None)
        finally:
            engine.destroy()
        returned = {int(result[INDEX_KEY].item()): result for result in results if result is not None}
        framework = f"areal {importlib.metadata.version(DISTRIBUTION)}"
        return [_record(spec, returned.get(index), episodes, index, framework)
                for index, spec in enumerate(job.trajectories)]


def _record(spec: TrajectorySpec, result: dict[str, Any] | None, episodes: Any, index: int,
            framework: str) -> SampleRecord:
    """One trajectory's sample: AReaL's tensors, or the error its workflow raised (AReaL returned None)."""
    if result is None:
        error = episodes.errors.get(index) or ErrorInfo("Rejected", "AReaL returned no episode (None)", "")
        return SampleRecord(spec.id, spec.group, "failed", status="None", prompt_length=len(spec.prompt_ids),
                            error=error, details={"framework": framework})
    ids = result["input_ids"][0].tolist()
    mask = result["loss_mask"][0].tolist()
    prompt_length = mask.index(1) if 1 in mask else len(mask)
    stop_reason, versions = episodes.responses.get(index, (None, []))
    response = ids[prompt_length:]
    outcome = "truncated" if stop_reason == "length" else "completed"
    return SampleRecord(spec.id, spec.group, outcome, status=stop_reason, prompt_length=prompt_length,
                        response_ids=response, logprobs=result["logprobs"][0].tolist()[prompt_length:],
                        loss_mask=mask[prompt_length:], response_length=len(response),
                        reward=float(result["rewards"][0].item()),
                        details={"framework": framework, "versions": versions})
