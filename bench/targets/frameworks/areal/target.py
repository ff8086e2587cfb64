"""`areal`: AReaL's real rollout path (PyPI `areal`), in its own environment, against the bench server.

AReaL's `RemoteSGLangEngine` connects to the bench as to an SGLang server (one `GET /health`, then
`/generate` with input ids and logprobs), and its executor runs one workflow episode per trajectory
(`submit`, then `wait`). Two workflows, chosen by `--target-option workflow=...` (default: `agent` when
the trajectories carry tools, else `rlvr`):

- `rlvr`: the real `RLVRWorkflow` (single turn): the prompt rendered from the trace's messages by AReaL's
  own chat-template call, the reward computed in AReaL's process pool (`rewards.score`, which honours
  `raise_after_generate`), the result a dict of `[1, L]` tensors. A subclass keeps AReaL's code and adds
  bookkeeping only: which trajectory each result belongs to, the response's finish reason and versions,
  and the error a workflow raised (AReaL logs it and hands back None).
- `agent`: AReaL's agentic path, a tool-calling agent on `ArealOpenAI` whose interactions AReaL exports
  and turns into tensors (`agent.py`): multi-turn, tools replayed from the trace, tool outputs under loss
  mask 0. Options: `engine_max_tokens` (AReaL's `AgentConfig.engine_max_tokens`, default None as in
  AReaL: no prompt + completion cap in the client), `tool_call_parser` (default `qwen`, AReaL's).

Every request names its trajectory (`X-Bench-Trajectory`, `naming.py`), so fault decisions are exact.
A sample's response ids, logprobs and loss mask are AReaL's tensors (the workflow's result, or for
`agent` what AReaL's executor handed its `should_accept_fn`), never rebuilt from the trace.

Variant: `plain` (AReaL as shipped; no seed pattern of its own).

Weight versions: AReaL stamps each generated token with its engine's own version counter (`versions`), the one its
trainer moves with `set_version` after every weight sync; its syncs never name a version to the server, so the
server's `weight_version` label does not move with them (`weights`). The counter is the only record of which policy
generated a token, so a sample's `weight_versions` are the counter's values on its trained tokens (also in
`details["versions"]`); in a one-step run nothing moves it: all 0.

Many steps (`run --steps K`, `session`): the engine and its executor live from step 0 to the last; each step is
AReaL's `prepare_batch`, and `update_weights(job)` is AReaL's trainer's weight sync (`weights`). Option
`max_head_offpolicyness` (AReaL's `rollout.max_head_offpolicyness`; its default 0 is synchronous, its GSM8K GRPO
example's 2): how far generation may run ahead of training; the adapter declares it as its `max_weight_lag` (0 when not
given: a sample one version behind is then a finding, the bench's default bound 1 narrowed). A one-step run is one
`submit` per trajectory and one `wait`, as before (every version 0).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
from typing import Any
from urllib.parse import urlparse

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob, TrajectorySpec


VARIANTS = ("plain",)
WORKFLOWS = ("rlvr", "agent")
DISTRIBUTION = "areal"
INDEX_KEY, REWARD_KEY, TRAJECTORY_KEY = "bench_index", "bench_reward", "bench_trajectory"


def workflow_of(job: RolloutJob) -> str:
    """The `workflow` option, else `agent` for trajectories with tools and `rlvr` for the rest."""
    chosen = job.options.get("workflow") or ("agent" if any(spec.tools for spec in job.trajectories) else "rlvr")
    if chosen not in WORKFLOWS:
        raise ValueError(f"areal option workflow={chosen!r}: expected one of {', '.join(WORKFLOWS)}")
    return str(chosen)


class ArealTarget:
    versionless_weight_sync = True  # its updates name no version: SGLang's label stays (`weights`)
    variants = VARIANTS
    fail_fast = False  # AReaL drops a failed episode (None) and goes on

    def __init__(self, variant: str = "plain") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"areal has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.name = f"areal:{variant}"
        self.session: Any = None  # a run of many steps: AReaL's engine from step 0 to the last (`session.Session`)
        self.offpolicyness: int | None = None
        self.start_error: str | None = None  # why step 0's engine did not start (a later step names it)

    def warm_up(self, options: dict[str, Any]) -> None:
        """torch, transformers and AReaL's engine (seconds); no thread or pool starts before the job."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import areal.engine.sglang_remote  # noqa: F401
        import areal.experimental.openai  # noqa: F401
        import areal.workflow.rlvr  # noqa: F401

        self.offpolicyness = _offpolicyness(options)

    def framework_info(self) -> dict[str, str]:
        """The installed AReaL, and the staleness it is configured to accept: `max_head_offpolicyness` versions
        (AReaL's bound on how far generation runs ahead of training), 0 (its default: synchronous) when not set."""
        return {"framework": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION),
                "max_weight_lag": str(getattr(self, "offpolicyness", None) or 0)}

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        if job.steps > 1:
            records = await asyncio.to_thread(self._step, job)
        else:
            records = await asyncio.to_thread(self._rollout, job)
        for record in records:
            emit(record)

    async def update_weights(self, job: RolloutJob) -> str:
        """AReaL's trainer side before a step of a run of many (`weights`): its engine made before step 0, as the
        trainer makes it before connecting its actor to it. Returns the engine's version, the one it published."""
        return await asyncio.to_thread(self._sync, job)

    def _sync(self, job: RolloutJob) -> str:
        if job.step == 0:
            from .session import Session

            self._stop()
            self.start_error = None
            session = None
            try:
                session = Session(job, _offpolicyness(job.options) or 0)
                session.start()
            except BaseException as raised:
                if session is not None:
                    session.stop()
                self.start_error = f"{type(raised).__name__}: {str(raised)[:300]}"
                raise
            self.session = session
        elif self.session is None:  # `--on-step-failure continue` after step 0's start failed: nothing to sync
            raise RuntimeError(
                f"areal step {job.step}: no engine to sync: AReaL's trainer makes its engine once, before step 0, "
                f"and step 0's weight sync failed ({self.start_error or 'the engine had stopped'}); "
                "a later step does not remake it from its own slice")
        return self.session.sync(job.step)

    def _step(self, job: RolloutJob) -> list[SampleRecord]:
        if self.session is None:
            raise RuntimeError(f"areal step {job.step}: no engine (its weight sync, `update_weights`, did not run)")
        last = job.step == job.steps - 1
        try:
            records = self.session.step(job)
        except BaseException:
            if job.on_step_failure == "stop":
                self._stop()  # the run ends here: the trainer's engine goes with it
            raise
        if last:
            self._stop()
        return records

    def _stop(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.stop()

    def _rollout(self, job: RolloutJob) -> list[SampleRecord]:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from areal.api.cli_args import InferenceEngineConfig
        from areal.engine.sglang_remote import RemoteSGLangEngine
        from transformers import AutoTokenizer

        from .workflow import Episodes

        workflow = workflow_of(job)
        tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
        config = InferenceEngineConfig(backend="sglang:d1", tokenizer_path=str(job.tokenizer_path),
                                       max_concurrent_rollouts=job.concurrency, consumer_batch_size=1,
                                       max_head_offpolicyness=10**9)  # one version: nothing to bound
        engine = RemoteSGLangEngine(config)
        address = urlparse(job.base_url)
        engine.initialize(addr=f"{address.hostname}:{address.port}")
        episodes = Episodes()
        try:
            from .session import workflow_items  # the items and workflows a step of many submits too

            items, workflows = workflow_items(job, workflow, job.trajectories, tokenizer, episodes)
            for index, item in enumerate(items):  # an agent's episodes are accepted by AReaL's own filter
                engine.submit(item, workflows[index],
                              **({"should_accept_fn": episodes.accept(index)} if workflow == "agent" else {}))
            results = engine.wait(len(job.trajectories), timeout=None)
        finally:
            engine.destroy()
        framework = f"areal {importlib.metadata.version(DISTRIBUTION)}"
        if workflow == "agent":
            return [_agent_record(spec, episodes, index, framework) for index, spec in enumerate(job.trajectories)]
        returned = {int(result[INDEX_KEY].item()): result for result in results if result is not None}
        return [_record(spec, returned.get(index), episodes, index, framework)
                for index, spec in enumerate(job.trajectories)]


def _offpolicyness(options: dict[str, Any]) -> int | None:
    """The `max_head_offpolicyness` option (None: not given)."""
    value = options.get("max_head_offpolicyness")
    if value is None:
        return None
    if not str(value).isdigit():
        raise ValueError(f"areal option max_head_offpolicyness={value!r}: expected a whole number of versions >= 0")
    return int(value)


def _versions(versions: list[int]) -> list[str]:
    """The distinct versions of AReaL's counter on a sample's trained tokens, oldest first."""
    return [str(v) for v in sorted(set(versions))]


def _sampling(spec: TrajectorySpec) -> tuple[int, float]:
    return (int(spec.sampling_params.get("max_new_tokens", 256)), float(spec.sampling_params.get("temperature", 1.0)))


def _failed(spec: TrajectorySpec, episodes: Any, index: int, framework: str) -> SampleRecord:
    error = episodes.errors.get(index) or ErrorInfo("Rejected", "AReaL returned no episode (None)", "")
    return SampleRecord(spec.id, spec.group, "failed", status="None", prompt_length=len(spec.prompt_ids),
                        error=error, details={"framework": framework})


def _record(spec: TrajectorySpec, result: dict[str, Any] | None, episodes: Any, index: int,
            framework: str) -> SampleRecord:
    """One trajectory's sample: AReaL's tensors, or the error its workflow raised (AReaL returned None)."""
    if result is None:
        return _failed(spec, episodes, index, framework)
    ids = result["input_ids"][0].tolist()
    mask = result["loss_mask"][0].tolist()
    prompt_length = mask.index(1) if 1 in mask else len(mask)
    stop_reason, versions = episodes.responses.get(index, (None, []))
    response = ids[prompt_length:]
    outcome = "truncated" if stop_reason == "length" else "completed"
    return SampleRecord(spec.id, spec.group, outcome, status=stop_reason, prompt_length=prompt_length,
                        response_ids=response, logprobs=result["logprobs"][0].tolist()[prompt_length:],
                        loss_mask=mask[prompt_length:], response_length=len(response),
                        reward=float(result["rewards"][0].item()), weight_versions=_versions(versions),
                        details={"framework": framework, "versions": versions})


def _agent_record(spec: TrajectorySpec, episodes: Any, index: int, framework: str) -> SampleRecord:
    """One agent episode's sample: the tensors AReaL's executor made of its exported leaf.

    The prompt is the first turn's input as AReaL sent it (the root interaction's `input_len`); the rest of
    the row is the response: every turn's output (loss mask 1) and tool messages (0), as AReaL laid them out.
    """
    result = episodes.accepted.get(index)
    leaves = episodes.leaves.get(index) or []
    if result is None or not leaves:
        return _failed(spec, episodes, index, framework)
    rows = int(result["input_ids"].shape[0])
    row = rows - 1  # concat export: one leaf per linear conversation; more is itself a finding (details)
    length = int(result["attention_mask"][row].sum().item())
    ids = result["input_ids"][row].tolist()[:length]
    mask = result["loss_mask"][row].tolist()[:length]
    logprobs = result["logprobs"][row].tolist()[:length]
    leaf = leaves[-1]
    root = leaf
    turns = 1
    while root.parent is not None:
        root, turns = root.parent, turns + 1
    prompt_length = root.model_response.input_len
    last = leaf.model_response
    outcome = "truncated" if last.stop_reason == "length" else "completed"
    trained = sorted({v for v, m in zip(result["versions"][row].tolist()[:length], mask) if m})  # AReaL's counter
    return SampleRecord(spec.id, spec.group, outcome, status=last.stop_reason, prompt_length=prompt_length,
                        response_ids=ids[prompt_length:], logprobs=logprobs[prompt_length:],
                        loss_mask=mask[prompt_length:], response_length=length - prompt_length,
                        reward=float(result["rewards"][row].item()), weight_versions=_versions(trained),
                        details={"framework": framework, "workflow": "agent", "export": "concat",
                                 "leaves": len(leaves), "rows": rows, "turns": turns, "versions": trained})
