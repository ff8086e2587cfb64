"""`verl`: verl's agent-loop rollout and replay buffer (PyPI `verl`, 0.8.0 or 0.9.1), in its own environment.

One run is one training step of verl's sync trainer as far as rollout goes: the trace's groups become the
step's prompts (one root `uid` per group, `rollout.n` = the group's size), verl's `AgentLoopManagerTQ`
dispatches them to its `AgentLoopWorkerTQ` actors, whose `SingleTurnAgentLoop`s render each prompt with
the tokenizer's chat template and generate through verl's client against the bench server
(`engine.BenchEngine` stands in for verl's SGLang server actor), and the trainer's `ReplayBuffer.sample()`
hands back what the trainer would train on. The adapter emits exactly those samples, read back from
TransferQueue. Which trainer runs follows the installed verl: 0.8.0's `main_ppo_sync` (`v0_8`), or 0.9's
`trainer/ppo/v1` (`v0_9`).

Variants:
- `shipped` (default): the buffer as released. Seed 002 (verl#6641, #6437): a group whose agent loop failed
  comes back partial (0.8.0 reads only `success` rows; 0.9.1 samples `failure` roots like finished ones);
  its missing members have no record (the runner marks them lost) and `group_completeness` says so.
- `patched`: `FailClosedReplayBuffer`, our fail-closed `sample()`. A refused group's failed sessions are
  `failed` with the error their agent loop raised; their siblings are `dropped`, naming the refusal.
  Every dispatched trajectory ends in exactly one outcome.

Ray runs for the job only (`prepare` starts it, `run` stops it; see `setup`): every Ray process is gone when
`run` returns.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob, TrajectorySpec
from bench.targets.frameworks import local_ray

VARIANTS = ("shipped", "patched")
DISTRIBUTION = "verl"
STEP = 1  # the training step the run plays
POLL_S = 0.2  # the replay buffer's poll interval (verl's default is 1 s)
SAMPLE_DEADLINE_S = 600.0  # `sample()` waits for every root; past this the run fails naming the ones running
CODE_ROOT = Path(__file__).resolve().parents[4]  # the checkout holding `bench`: Ray's workers import it


class VerlTarget:
    variants = VARIANTS
    fail_fast = False  # a failed agent loop ends its session; the step goes on

    def __init__(self, variant: str = "shipped") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"verl has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.variant = variant
        self.name = f"verl:{variant}"

    def warm_up(self, options: dict[str, Any]) -> None:
        """verl's trainer module and its imports (seconds); Ray is not started before the job."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        _version_module()

    def framework_info(self) -> dict[str, str]:
        return {"framework": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION)}

    def prepare(self, job: RolloutJob) -> None:
        """Ray, TransferQueue and verl's actors up and constructed (half a minute or more on 2 cores)."""
        self._step = _Step(job, self.variant)
        try:
            self._step.start()
        except BaseException:
            self._step.stop()
            raise

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        if getattr(self, "_step", None) is None:
            await asyncio.to_thread(self.prepare, job)
        step, self._step = self._step, None
        try:
            records = await asyncio.to_thread(step.run_step)
        finally:
            await asyncio.to_thread(step.stop)
        for record in records:
            emit(record)


class _Step:
    """One rollout step of verl's sync trainer: started in a fresh Ray runtime, stopped with it."""

    def __init__(self, job: RolloutJob, variant: str) -> None:
        self.job, self.variant = job, variant
        self.groups = job.groups()
        self.members = {uid: [spec.id for spec in specs] for uid, specs in self.groups.items()}
        self.framework = f"verl {importlib.metadata.version(DISTRIBUTION)}"
        self.session: Path | None = None
        self.scratch: tempfile.TemporaryDirectory[str] | None = None
        self.rollout: Any = None
        self.engine: Any = None
        self.tq_started = False

    def start(self) -> None:
        import ray
        import transfer_queue as tq

        from . import setup

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.session = local_ray.session_dir()
        local_ray.start(self.session, setup.RAY_CPUS, [CODE_ROOT])
        from . import common
        from .engine import BenchEngine

        version = _version_module()
        self.scratch = tempfile.TemporaryDirectory(prefix="rollout-bench-verl-")
        response_length = max(int(s.sampling_params.get("max_new_tokens", 1024)) for s in self.job.trajectories)
        prompt_length = self.job.context_length - response_length
        model = setup.model_folder(self.job.tokenizer_path, Path(self.scratch.name))
        config = setup.trainer_config(model, max(map(len, self.groups.values())), prompt_length, response_length)
        tq.init(config.transfer_queue)
        self.tq_started = True
        self.engine = ray.remote(BenchEngine).remote(self.job.base_url, prompt_length, response_length,
                                                     self.job.context_length)
        self.ledger = ray.remote(common.Ledger).options(name=common.LEDGER_NAME).remote()
        client = common.BenchLLMClient(config, load_balancer_handle=version.Rollout.balancer({"bench-0": self.engine}))
        self.rollout = version.Rollout(config, self.variant, client, POLL_S)
        ray.get([worker.__ray_ready__.remote() for worker in self.rollout.workers])

    def run_step(self) -> list[SampleRecord]:
        import ray
        import transfer_queue as tq

        from . import common

        self.rollout.dispatch(self._prompts(), STEP)
        batch = _sample_within(self.rollout, len(self.groups), SAMPLE_DEADLINE_S)
        dispatched = {spec.id for spec in self.job.trajectories}
        still_running = common.wait_settled(self.ledger, dispatched, SAMPLE_DEADLINE_S)
        if still_running:
            raise TimeoutError(f"agent loops still running {SAMPLE_DEADLINE_S:.0f} s after sample() returned: "
                               f"{sorted(still_running)[:10]}")
        rows = (tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                select_fields=["prompts", "responses", "response_mask", "rollout_log_probs"])
                if batch.keys else None)
        errors, _settled = ray.get(self.ledger.report.remote())
        finish = ray.get(self.engine.finish_reasons_seen.remote())
        return self._records(batch.keys, rows, finish) + self._refused(self.rollout.rejected, errors)

    def stop(self) -> None:
        """Everything `start` started, in reverse, whatever state it reached."""
        import ray

        from . import setup

        try:
            if self.rollout is not None:
                self.rollout.close()
            if self.engine is not None:
                ray.get(self.engine.close.remote(), timeout=10)
            if self.tq_started:
                import transfer_queue as tq

                tq.close()
        finally:
            if self.session is not None:
                local_ray.stop(self.session)
            if self.scratch is not None:
                self.scratch.cleanup()

    def _prompts(self) -> Any:
        """The step's batch as verl's trainer builds it: one row per root prompt, `rollout.n` per group."""
        import numpy as np
        from verl.utils import tensordict_utils as tu

        from .common import MEMBERS_KEY

        uids = list(self.groups)
        raw_prompt = np.empty(len(uids), dtype=object)
        for i, uid in enumerate(uids):
            first = self.groups[uid][0]
            if first.messages is None:
                raise ValueError(f"trajectory {first.id}: verl's agent loop renders the prompt from its messages, "
                                 "and this trace holds none")
            raw_prompt[i] = first.messages
        batch = tu.get_tensordict({
            "raw_prompt": raw_prompt,
            "uid": np.array(uids, dtype=object),
            "index": np.arange(len(uids)),
            MEMBERS_KEY: np.array(["|".join(self.members[uid]) for uid in uids], dtype=object),
            "__rollout_n__": np.array([len(self.members[uid]) for uid in uids], dtype=np.int64),
        })
        tu.assign_non_tensor_data(batch, "global_steps", STEP)
        return batch

    def _records(self, keys: list[str], rows: Any, finish: dict[str, str | None]) -> list[SampleRecord]:
        """What `sample()` handed the trainer, one record per row."""
        by_id = {spec.id: spec for spec in self.job.trajectories}
        records = []
        for position, key in enumerate(keys):
            uid, session, _index = key.split("_")
            spec = by_id[self.members[uid][int(session)]]
            prompt = rows["prompts"][position].tolist()
            response = rows["responses"][position].tolist()
            mask = rows["response_mask"][position].tolist()
            logprobs = rows["rollout_log_probs"][position].tolist() if "rollout_log_probs" in rows else None
            reason = finish.get(spec.id)
            records.append(SampleRecord(spec.id, spec.group, "truncated" if reason == "length" else "completed",
                                        status=reason, prompt_length=len(prompt), response_ids=response,
                                        logprobs=logprobs, loss_mask=mask, response_length=len(response),
                                        details={"framework": self.framework, "key": key}))
        return records

    def _refused(self, rejected: dict[str, str], errors: dict[str, ErrorInfo]) -> list[SampleRecord]:
        """`patched` only: each member of a refused group, failed (its own error) or dropped (the refusal)."""
        records = []
        for uid, reason in rejected.items():
            for spec in self.groups[uid]:
                records.append(_refused_member(spec, reason, errors.get(spec.id), self.framework))
        return records


def _refused_member(spec: TrajectorySpec, reason: str, error: ErrorInfo | None, framework: str) -> SampleRecord:
    if error is not None:
        return SampleRecord(spec.id, spec.group, "failed", status="failure", prompt_length=len(spec.prompt_ids),
                            error=error, details={"framework": framework, "refused": reason})
    return SampleRecord(spec.id, spec.group, "dropped", status="refused", prompt_length=len(spec.prompt_ids),
                        error=ErrorInfo("IncompleteGroup", reason, ""), details={"framework": framework})


def _version_module() -> Any:
    """How this verl lays out its sync trainer: 0.8.0's `main_ppo_sync`, or 0.9's `trainer/ppo/v1`."""
    if importlib.util.find_spec("verl.trainer.main_ppo_sync") is not None:
        from . import v0_8

        return v0_8
    from . import v0_9

    return v0_9


def _sample_within(rollout: Any, groups: int, deadline_s: float) -> Any:
    """verl's `sample()` (it blocks while any root is pending or running) on a thread, given up after the deadline."""
    result: dict[str, Any] = {}

    def take() -> None:
        try:
            result["batch"] = rollout.sample(STEP, groups)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            result["error"] = error

    thread = threading.Thread(target=take, name="verl-replay-buffer-sample", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if "error" in result:
        raise result["error"]
    if "batch" not in result:
        raise TimeoutError(f"ReplayBuffer.sample() still waiting after {deadline_s:.0f} s; roots not done: "
                           f"{rollout.running()}")
    return result["batch"]
