"""`verl`: verl's agent-loop rollout and replay buffer (PyPI `verl`, 0.8.0 or 0.9.1), in its own environment.

A step is one training step of verl's sync trainer as far as rollout goes: the step's groups become its prompts
(one root `uid` per group, `rollout.n` = the group's size), verl's `AgentLoopManagerTQ` dispatches them to its
`AgentLoopWorkerTQ` actors, whose `SingleTurnAgentLoop`s render each prompt with the tokenizer's chat template
and generate through verl's client against the bench server (`engine.BenchEngine` stands in for verl's SGLang
server actor), and the trainer's `ReplayBuffer.sample()`
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

Steps (`run --steps K`) go as in verl's `PPOTrainer.fit`: one Ray runtime, one TransferQueue, one agent-loop
manager with its workers and one replay buffer serve every step; step k's prompts carry `global_steps` k + 1
(verl counts from 1) and `sample()` takes that step's roots. Between steps the adapter is the trainer side
(`update_weights`, `weights`): its server asleep after each sample, the batch's rows cleared, and before each step
its weight sync (resume, update from tensor, flush, resume). No training runs and no validation is played.

Ray runs for the run only (`prepare` starts it at the first step; `run` stops it after the last step, or after a
step that raised when the run stops there; see `setup`): every Ray process is gone when that `run` returns. A
one-step run starts and stops it around its single step, with no weight sync, as before steps existed.
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

from . import weights

VARIANTS = ("shipped", "patched")
DISTRIBUTION = "verl"
POLL_S = 0.2  # the replay buffer's poll interval (verl's default is 1 s)
SAMPLE_DEADLINE_S = 600.0  # `sample()` waits for every root; past this the run fails naming the ones running
CODE_ROOT = Path(__file__).resolve().parents[4]  # the checkout holding `bench`: Ray's workers import it


class VerlTarget:
    versionless_weight_sync = True  # its update names no `weight_version`: SGLang's label stays (`weights`)
    variants = VARIANTS
    fail_fast = False  # a failed agent loop ends its session; the step goes on

    def __init__(self, variant: str = "shipped") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"verl has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.variant = variant
        self.name = f"verl:{variant}"
        self._trainer: _Trainer | None = None

    def warm_up(self, options: dict[str, Any]) -> None:
        """verl's trainer module and its imports (seconds); Ray is not started before the job."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        _version_module()

    def framework_info(self) -> dict[str, str]:
        return {"framework": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION)}

    def prepare(self, job: RolloutJob) -> None:
        """Ray, TransferQueue and verl's actors up and constructed (half a minute or more on 2 cores). Once per
        run: a later step finds them running, as every step of verl's `fit` does."""
        if self._trainer is not None:
            return
        trainer = _Trainer(job, self.variant)
        try:
            trainer.start()
        except BaseException:
            trainer.stop()
            raise
        self._trainer = trainer

    async def update_weights(self, job: RolloutJob) -> None:
        """The trainer side before step `job.step` (`run --steps K` only): at step 0 the trainer is built and puts
        its rollout server to sleep; then its weight sync wakes the server with the new weights (`weights`).
        Returns None: verl's sync names no weight version to the server, whose version stays where it was; verl's
        own (0.9.1: the step the weights come from) goes to its server actor (`engine.BenchEngine`)."""
        try:
            if self._trainer is None:
                await asyncio.to_thread(self.prepare, job)
                assert self._trainer is not None
                await weights.sleep(job.base_url)  # the end of `init_workers` / `_setup`
            await self._trainer.sync_weights(job)
        except BaseException:
            if _ends_run(job):
                await asyncio.to_thread(self._stop)
            raise
        return None

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        """One step: dispatch, `sample()`, the records. The runtime is stopped after the last step, or after a step
        that raised when the run stops there; otherwise kept for the next step."""
        if self._trainer is None:
            await asyncio.to_thread(self.prepare, job)
        trainer = self._trainer
        assert trainer is not None
        last = job.step >= job.steps - 1
        ended = False
        try:
            records, batch = await asyncio.to_thread(trainer.run_step, job)
            if not last:  # the trainer's side after a step's sample: its server asleep, the batch's rows cleared
                await weights.sleep(job.base_url)
                await asyncio.to_thread(trainer.rollout.finish_step, batch)
        except BaseException:
            ended = _ends_run(job)
            raise
        finally:
            if last or ended:
                await asyncio.to_thread(self._stop)
        for record in records:
            emit(record)

    def _stop(self) -> None:
        trainer, self._trainer = self._trainer, None
        if trainer is not None:
            trainer.stop()


def _ends_run(job: RolloutJob) -> bool:
    """Whether a step that raised is the run's last: the last step, or any under `on_step_failure = "stop"`."""
    return job.step >= job.steps - 1 or job.on_step_failure == "stop"


class _Trainer:
    """The rollout side of verl's sync trainer for a whole run: Ray, TransferQueue, the agent-loop manager and
    its workers, the replay buffer, the server handle; built for the first step's job, stopped once."""

    def __init__(self, job: RolloutJob, variant: str) -> None:
        self.job, self.variant = job, variant
        self.framework = f"verl {importlib.metadata.version(DISTRIBUTION)}"
        self.session: Path | None = None
        self.scratch: tempfile.TemporaryDirectory[str] | None = None
        self.rollout: Any = None
        self.engine: Any = None
        self.tq_started = False
        self.version: Any = None
        self.response_length = 0

    def start(self) -> None:
        import ray
        import transfer_queue as tq

        from . import setup

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.session = local_ray.session_dir()
        local_ray.start(self.session, setup.RAY_CPUS, [CODE_ROOT])
        from . import common
        from .engine import BenchEngine

        self.version = version = _version_module()
        # inside Ray's session folder: a worker killed before its teardown leaves it there, and the next run's
        # `local_ray.session_dir` removes both (a folder of its own in /tmp stayed behind)
        self.scratch = tempfile.TemporaryDirectory(prefix="verl-", dir=self.session, ignore_cleanup_errors=True)
        groups = self.job.groups()
        self.response_length = _response_length(self.job)
        prompt_length = self.job.context_length - self.response_length
        model = setup.model_folder(self.job.tokenizer_path, Path(self.scratch.name))
        config = setup.trainer_config(model, max(map(len, groups.values())), prompt_length, self.response_length)
        tq.init(config.transfer_queue)
        self.tq_started = True
        self.engine = ray.remote(BenchEngine).remote(self.job.base_url, prompt_length, self.response_length,
                                                     self.job.context_length)
        self.ledger = ray.remote(common.Ledger).options(name=common.LEDGER_NAME).remote()
        client = common.BenchLLMClient(config, load_balancer_handle=version.Rollout.balancer({"bench-0": self.engine}))
        self.rollout = version.Rollout(config, self.variant, client, POLL_S)
        ray.get([worker.__ray_ready__.remote() for worker in self.rollout.workers])

    async def sync_weights(self, job: RolloutJob) -> None:
        """The trainer's weight sync before step `job.step`; 0.9.1 names the step its weights come from: 0 before
        the first (`on_init_end`), then the step just trained (`on_step_end`), `global_steps` = `job.step`."""
        async def set_global_steps() -> None:
            await self.engine.set_global_steps.remote(job.step)

        await weights.wake_and_update(job.base_url, set_global_steps if self.version.PUBLISHES_GLOBAL_STEPS else None)

    def run_step(self, job: RolloutJob) -> tuple[list[SampleRecord], Any]:
        """Step `job.step` as `PPOTrainer.step` plays it (`global_steps` = step + 1: verl counts from 1); its
        records and the batch `sample()` returned."""
        import ray
        import transfer_queue as tq

        from . import common

        needed = _response_length(job)
        if needed > self.response_length:
            raise ValueError(f"step {job.step} asks for {needed} new tokens, but verl's trainer was configured at "
                             f"step 0 for {self.response_length} (one config for the whole run, as verl's)")
        groups = job.groups()
        global_steps = job.step + 1
        self.rollout.dispatch(_prompts(groups, global_steps), global_steps)
        batch = _sample_within(self.rollout, global_steps, len(groups), SAMPLE_DEADLINE_S)
        dispatched = {spec.id for spec in job.trajectories}
        still_running = common.wait_settled(self.ledger, dispatched, SAMPLE_DEADLINE_S)
        if still_running:
            raise TimeoutError(f"agent loops still running {SAMPLE_DEADLINE_S:.0f} s after sample() returned: "
                               f"{sorted(still_running)[:10]}")
        rows = (tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                select_fields=["prompts", "responses", "response_mask", "rollout_log_probs"])
                if batch.keys else None)
        errors, _settled = ray.get(self.ledger.report.remote())
        finish = ray.get(self.engine.finish_reasons_seen.remote())
        rejected = {uid: why for uid, why in self.rollout.rejected.items() if uid in groups}  # this step's
        records = _records(job, groups, batch.keys, batch.tags, rows, finish, self.framework)
        return records + _refused(groups, rejected, errors, self.framework), batch

    def stop(self) -> None:
        """Everything `start` started, in reverse, whatever state it reached."""
        import ray

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


def _response_length(job: RolloutJob) -> int:
    return max(int(s.sampling_params.get("max_new_tokens", 1024)) for s in job.trajectories)


def _members(groups: dict[str, list[TrajectorySpec]]) -> dict[str, list[str]]:
    return {uid: [spec.id for spec in specs] for uid, specs in groups.items()}


def _prompts(groups: dict[str, list[TrajectorySpec]], global_steps: int) -> Any:
    """The step's batch as verl's trainer builds it: one row per root prompt, `rollout.n` per group."""
    import numpy as np
    from verl.utils import tensordict_utils as tu

    from .common import MEMBERS_KEY

    uids = list(groups)
    members = _members(groups)
    raw_prompt = np.empty(len(uids), dtype=object)
    for i, uid in enumerate(uids):
        first = groups[uid][0]
        if first.messages is None:
            raise ValueError(f"trajectory {first.id}: verl's agent loop renders the prompt from its messages, "
                             "and this trace holds none")
        raw_prompt[i] = first.messages
    batch = tu.get_tensordict({
        "raw_prompt": raw_prompt,
        "uid": np.array(uids, dtype=object),
        "index": np.arange(len(uids)),
        MEMBERS_KEY: np.array(["|".join(members[uid]) for uid in uids], dtype=object),
        "__rollout_n__": np.array([len(members[uid]) for uid in uids], dtype=np.int64),
    })
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch


def _records(job: RolloutJob, groups: dict[str, list[TrajectorySpec]], keys: list[str], tags: list[dict[str, Any]],
             rows: Any, finish: dict[str, str | None], framework: str) -> list[SampleRecord]:
    """What `sample()` handed the trainer, one record per row. Where verl tags a row with the weight versions it was
    generated under (0.9.1: `min_global_steps`, from its server actor's `global_steps`), `details` keeps them."""
    by_id = {spec.id: spec for spec in job.trajectories}
    members = _members(groups)
    records = []
    for position, key in enumerate(keys):
        uid, session, _index = key.split("_")
        spec = by_id[members[uid][int(session)]]
        prompt = rows["prompts"][position].tolist()
        response = rows["responses"][position].tolist()
        mask = rows["response_mask"][position].tolist()
        logprobs = rows["rollout_log_probs"][position].tolist() if "rollout_log_probs" in rows else None
        reason = finish.get(spec.id)
        details: dict[str, Any] = {"framework": framework, "key": key}
        tag = tags[position]
        if "min_global_steps" in tag:
            details["global_steps"] = [tag.get("min_global_steps"), tag.get("max_global_steps")]
        records.append(SampleRecord(spec.id, spec.group, "truncated" if reason == "length" else "completed",
                                    status=reason, prompt_length=len(prompt), response_ids=response,
                                    logprobs=logprobs, loss_mask=mask, response_length=len(response),
                                    details=details))
    return records


def _refused(groups: dict[str, list[TrajectorySpec]], rejected: dict[str, str], errors: dict[str, ErrorInfo],
             framework: str) -> list[SampleRecord]:
    """`patched` only: each member of a refused group, failed (its own error) or dropped (the refusal)."""
    return [_refused_member(spec, reason, errors.get(spec.id), framework)
            for uid, reason in rejected.items() for spec in groups[uid]]


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


def _sample_within(rollout: Any, global_steps: int, groups: int, deadline_s: float) -> Any:
    """verl's `sample()` (it blocks while any root is pending or running) on a thread, given up after the deadline."""
    result: dict[str, Any] = {}

    def take() -> None:
        try:
            result["batch"] = rollout.sample(global_steps, groups)
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
