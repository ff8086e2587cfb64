"""`prime-rl`: prime-rl's orchestrator `Scheduler` from a source checkout, over a real verifiers env server.

One run is one `generate_batch` of prime-rl's real `Scheduler` (`src/prime_rl/orchestrator/scheduler.py`) with
the batch size of the job: its real `TrainEnvs` spawns verifiers' ZMQ env server (and its worker processes), which
import the bench's environment by id (`environment`: one single-turn task per group, scored as a group); its
real `StaticInferencePool` builds the `vf.ClientConfig`s of type `openai_chat_completions` at the bench's `/v1`;
its real `Buffer` keeps its pools, with the example draw replaced (`buffer`: each group once, a dropped group
replayed). `max_async_level` is huge, so no weight update is ever waited for. The rollouts the batch returns are
emitted as completed or truncated samples (verifiers' `RolloutOutput` through the verifiers target's `records`);
a group the batch never returned is reported failed with the errors its last attempt ended with.

When `generate_batch` raises (prime-rl#2579 fails the batch on a rollout error verifiers did not mark retryable)
the dropped group is reported failed and the raise is the run's batch error; the rest is lost, as the
orchestrator exits there. The adapter declares `fail_fast` when the checkout's scheduler has that policy.

Options (`--target-option`):
- `source` (`--source DIR`, or `ROLLOUT_BENCH_PRIME_RL_PATH`): the prime-rl checkout; its `src` and
  `packages/prime-rl-configs/src` go on the import path. A checkout after prime-rl#2639 (June 2026), which
  replaced the Scheduler, is refused by name.
- `verifiers_source`: a verifiers checkout (e.g. verifiers#1427) imported instead of the installed verifiers
  0.1.14, in the orchestrator and in the env server it spawns.
- `max_retries` (1): the OpenAI SDK's retries of each model call. prime-rl builds its clients with 10, whose
  backoff (0.5 s doubling to 8 s) outlasts seed-003's 10-second outage, so the scheduler would never see it; with
  1 the SDK still retries a 429 and the outage reaches the scheduler after one retry. `max_retries=10` is prime-rl's.
- `max_error_reschedule_attempts`: prime-rl's own (its default, 3, when not given; checkouts without it refuse it).
- `max_redraws` (8): times one dropped group is replayed before the bench gives it up (see `buffer`).
- `max_async_level`: prime-rl's own; over steps its default (1), in a one-batch run huge (no update is awaited).

Over steps (`run --steps K`) one Scheduler, TrainEnvs (one env server), Buffer and pool serve every step:
`generate_batch(step)` per step with the step's groups added to the buffer (`_Batch.hand_over`), and before each
step the trainer's checkpoint published for the scheduler's own policy-update loop to apply through the server's
admin routes (`update_weights`); torn down once, after the last step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.records.attribution import TRAJECTORY_HEADER
from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob, TrajectorySpec
from bench.targets.frameworks.verifiers.records import error_info, record_of
from bench.targets.frameworks.verifiers.target import TraceFacts, _trace_path

from ..checkout import Checkout, CheckoutError, named_source, read_checkout
from ..options import check_options
from . import environment
from .environment import GROUP_KEY, MEMBERS_KEY, STATE_KEY, info_of

OPTIONS = ("source", "verifiers_source", "max_retries", "max_error_reschedule_attempts", "max_redraws",
           "max_async_level")
PATH_ENV = "ROLLOUT_BENCH_PRIME_RL_PATH"
MARKER = "packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py"
SCHEDULER = "src/prime_rl/orchestrator/scheduler.py"
VERIFIERS_MARKER = "verifiers/__init__.py"
MAX_RETRIES = 1
MAX_REDRAWS = 8
MAX_ASYNC_LEVEL = 1  # prime-rl's default (`OrchestratorConfig.max_async_level`)
ENV_NAME = "bench"
SCRATCH_PREFIX = "rollout-bench-prime-rl-"  # + the worker's pid: the env server's logs live there
API_KEY_VAR = "ROLLOUT_BENCH_API_KEY"  # unset: the SDK sends "EMPTY"


class PrimeRlTarget:
    fail_fast = False  # set from the checkout in `warm_up`

    def __init__(self, variant: str = "") -> None:
        if variant:
            raise ValueError(f"prime-rl has no variants (the checkout is the code judged), not {variant!r}")
        self.name = "prime-rl"
        self.checkout: Checkout | None = None
        self.verifiers_checkout: Checkout | None = None

    def warm_up(self, options: dict[str, Any]) -> None:
        """Both checkouts onto the import path, the placeholders in, prime-rl's orchestrator modules imported."""
        check_options("prime-rl", options, OPTIONS,
                      {"max_retries": 0, "max_error_reschedule_attempts": 1, "max_redraws": 0, "max_async_level": 0})
        named = named_source(options, PATH_ENV)
        if named is None:
            raise ValueError(f"prime-rl runs from a source checkout: give --source DIR (or set {PATH_ENV})")
        checkout = read_checkout("prime-rl", named, MARKER)
        if not (checkout.path / SCHEDULER).is_file():
            raise CheckoutError(f"prime-rl source {named!r} has no {SCHEDULER}: its orchestrator no longer has the "
                                "Scheduler this adapter drives (prime-rl#2639 replaced it, June 2026); use a "
                                "checkout from before it")
        if self.checkout is not None and self.checkout.path != checkout.path:
            raise ValueError(f"prime-rl: this worker imported {self.checkout.path}, not {checkout.path}")
        self.checkout = checkout
        paths = [checkout.path / "src", checkout.path / "packages" / "prime-rl-configs" / "src"]
        if options.get("verifiers_source"):
            self.verifiers_checkout = read_checkout("verifiers", str(options["verifiers_source"]), VERIFIERS_MARKER)
            paths.insert(0, self.verifiers_checkout.path)
        for path in reversed(paths):  # the env server and its workers are spawned: they get this sys.path
            if str(path) not in sys.path:
                sys.path.insert(0, str(path))
        from . import stubs

        try:
            _refuse_unusable_verifiers(self.verifiers_checkout)
            stubs.install()
            from prime_rl.orchestrator import buffer, envs, scheduler  # noqa: F401
            from prime_rl.utils import client  # noqa: F401
        except ModuleNotFoundError as missing:
            raise ModuleNotFoundError(f"prime-rl at {checkout.path} imports {missing.name!r}, which this "
                                      f"interpreter ({sys.executable}) lacks: build its environment with "
                                      "`make prime-rl-env`, or name one with --python") from missing
        self.fail_fast = hasattr(scheduler, "is_reschedulable_rollout_error")  # prime-rl#2579's explicit policy
        self.max_retries = int(options.get("max_retries", MAX_RETRIES))
        self.options = dict(options)

    def framework_info(self) -> dict[str, str]:
        """The checkout and its commit, the verifiers it ran with (installed or a checkout), and the SDK's retries."""
        info = self.checkout.info() if self.checkout else {"framework": "prime-rl"}
        import verifiers

        version = getattr(verifiers, "__version__", None) or importlib.metadata.version("verifiers")
        if self.verifiers_checkout is not None:
            checkout = self.verifiers_checkout
            info["verifiers"] = f"{version} @ {checkout.commit} ({checkout.path})"
        else:
            info["verifiers"] = version
        info["openai"] = importlib.metadata.version("openai")
        info["client_max_retries"] = str(getattr(self, "max_retries", MAX_RETRIES))
        from prime_rl.configs.orchestrator import OrchestratorConfig

        # the staleness a trained-on rollout may have: the scheduler drops a group still in flight after
        # `max_off_policy_steps` policy updates (`scheduler.py`, `_update_off_policy`), so a rollout it returns
        # spans at most that many (`max_async_level` bounds the policy's lag behind the step, not the rollout's)
        info["max_weight_lag"] = str(OrchestratorConfig.model_fields["max_off_policy_steps"].default)
        return info

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        """On the worker's main loop: verifiers installs signal handlers when an environment is built, which only
        the main thread may do, so prime-rl's env start-up (seconds: two processes import verifiers) is part of
        the run. It sends nothing, so no fault window starts before the scheduler's first request.

        In a run of many steps (`run --steps K`) the first step builds the Scheduler, TrainEnvs (and their env
        server), Buffer and pool, and every step calls `generate_batch(step)` on them with its own groups handed
        to the buffer, as prime-rl's orchestrator loop calls it once per step (`orchestrator.py`, `orchestrate`);
        all of it is torn down after the last step (or after a failed one when the run stops there)."""
        if self.checkout is None:
            self.warm_up(job.options)
        ended = job.step == job.steps - 1
        try:
            if getattr(self, "batch", None) is None:
                self.scratch = tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")  # env logs
                self.batch = await _Batch.start(job, Path(self.scratch.name), self.options)
            else:
                await self.batch.hand_over(job)
            await self.batch.generate(emit, job.step)
        except BaseException:
            ended = ended or job.on_step_failure == "stop"
            raise
        finally:
            if ended:
                await self._stop()

    async def update_weights(self, job: RolloutJob) -> str:
        """prime-rl's trainer side before step `job.step` (`run --steps K`): the trainer publishes checkpoint n by
        writing `broadcasts/step_<n>/STABLE` in the output folder; the orchestrator's own policy-update loop
        (`scheduler.py`, `update_policy_loop` / `_apply_policy_update`) finds it and makes the admin calls on the
        inference server (`utils/client.py`, `update_weights`: `/pause?mode=keep`, `/update_weights` with the
        checkpoint's folder, `/resume`). The trainer here is as far behind as prime-rl lets it be: before step k it
        has published checkpoint max(k - max_async_level, 0), the one the scheduler would wait for
        (`_compute_next_ckpt_step`); checkpoint 0 is the initial weights, never sent. Waits until the scheduler
        has applied it, so the step starts on it; the version is the checkpoint's step."""
        batch = getattr(self, "batch", None)
        if batch is None:
            return "0"
        return str(await batch.publish_checkpoint(max(job.step - batch.max_async_level, 0)))

    async def _stop(self) -> None:
        batch, self.batch = getattr(self, "batch", None), None
        try:
            if batch is not None:
                await batch.stop()
        finally:
            scratch = getattr(self, "scratch", None)
            if scratch is not None:
                scratch.cleanup()
                self.scratch = None


def _refuse_unusable_verifiers(checkout: Checkout | None) -> None:
    """prime-rl at these commits needs verifiers' v0 API (`vf.ClientConfig`, `verifiers.serve`): refuse a
    verifiers without it (0.4 and later ship only `verifiers.v1`), naming what is missing."""
    import verifiers as vf

    version = getattr(vf, "__version__", None) or importlib.metadata.version("verifiers")
    where = f"verifiers {version} ({checkout.path if checkout else Path(vf.__file__).parent})"
    missing = [name for name in ("ClientConfig", "RolloutInput", "RolloutOutput", "SingleTurnEnv", "load_environment")
               if not hasattr(vf, name)]
    try:
        import verifiers.serve  # noqa: F401
    except ImportError:
        missing.append("verifiers.serve (ZMQEnvClient, ZMQEnvServer)")
    if missing:
        raise ValueError(f"prime-rl's orchestrator uses verifiers' v0 API, which {where} lacks: "
                         f"{', '.join(missing)} (verifiers 0.4 ships only verifiers.v1); prime-rl at these commits "
                         "pins verifiers 58b119fa1 (0.1.14 on the error path): run it with that, or give a v0 "
                         "checkout with --target-option verifiers_source=DIR")


class _Batch:
    """One `generate_batch` and everything it needs, built and run on prime-rl's loop."""

    def __init__(self, job: RolloutJob, groups: dict[str, list[TrajectorySpec]], train_envs: Any, buffer: Any,
                 scheduler: Any, output_dir: Path) -> None:
        self.job, self.groups, self.train_envs, self.buffer, self.scheduler = job, groups, train_envs, buffer, scheduler
        self.output_dir = output_dir
        self.max_async_level = scheduler.max_async_level
        self.by_example = {index: members for index, members in enumerate(groups.values())}
        self.step_examples = set(self.by_example)  # the running step's example ids
        self.reported: set[int] = set()  # given-up groups already reported
        self.last: dict[str, dict[str, Any]] = {}  # trajectory -> the output of its latest attempt
        self.policy: dict[str, str | None] = {}  # trajectory -> the checkpoint its latest attempt was sent under
        self.attempts: dict[str, int] = {}  # group -> group rollouts that came back
        env = train_envs.get(ENV_NAME).env
        env.observe = self._observe

    @classmethod
    async def start(cls, job: RolloutJob, scratch: Path, options: dict[str, Any]) -> "_Batch":
        from prime_rl.configs.orchestrator import OrchestratorConfig
        from prime_rl.configs.shared import ClientConfig
        from prime_rl.orchestrator.buffer import Buffer
        from prime_rl.orchestrator.envs import TrainEnvs
        from prime_rl.orchestrator.scheduler import Scheduler
        from prime_rl.utils.client import StaticInferencePool

        from .buffer import bench_buffer_class

        groups = job.groups()
        sizes = {len(members) for members in groups.values()}
        if len(sizes) != 1:
            raise ValueError(f"prime-rl runs groups of one size (rollouts_per_example); this job has sizes "
                             f"{sorted(sizes)}: select whole groups")
        size = sizes.pop()
        facts = TraceFacts.load(_trace_path(job, "single_turn"), job.trajectories)
        rows_path = scratch / "rows.json"
        environment.write_rows(rows_path, _rows(groups, facts))
        config = OrchestratorConfig(**_config_fields(job, size, rows_path, scratch, options))
        pool = StaticInferencePool(
            ClientConfig(base_url=[job.base_url + "/v1"], api_key_var=API_KEY_VAR,
                         extra_headers_from_state={TRAJECTORY_HEADER: STATE_KEY}),
            model_name=config.student.model.name, train_client_type="openai_chat_completions")
        for client in pool.train_clients:  # prime-rl hard-codes 10 (see the module docstring)
            client.max_retries = int(options.get("max_retries", MAX_RETRIES))
        train_envs = TrainEnvs(config.train.env)
        await train_envs.start(log_dir=scratch / "envs", log_level="INFO")
        buffer = bench_buffer_class(Buffer)(train_envs, config.buffer, order=list(range(len(groups))),
                                            max_redraws=int(options.get("max_redraws", MAX_REDRAWS)))
        scheduler = Scheduler(
            train_envs=train_envs, student_inference=pool, teacher_inference=None, buffer=buffer, config=config,
            max_inflight_rollouts=config.max_inflight_rollouts, max_async_level=config.max_async_level,
            max_off_policy_steps=config.max_off_policy_steps, strict_async_level=config.strict_async_level,
            tasks_per_minute=config.tasks_per_minute, lora_name=None)
        buffer.scheduler = scheduler
        buffer.check_shape(_rows(groups, facts))  # a later step's examples are made the same way
        return cls(job, groups, train_envs, buffer, scheduler, config.output_dir)

    async def hand_over(self, job: RolloutJob) -> None:
        """A later step's groups: new examples in the buffer, numbered on from the earlier steps'. The parked
        groups the scheduler holds (it asked for more work once the last step's groups were out: they stand for
        this step's work) are dropped with its own `drop_group`, so it draws this step's examples in their place."""
        from .buffer import PARKED

        groups = job.groups()
        start = len(self.by_example)
        rows = _rows(groups, TraceFacts.load(_trace_path(job, "single_turn"), job.trajectories), start)
        self.buffer.add_examples(rows)
        for group_id, group in list(self.scheduler.groups.items()):
            if group.example["example_id"] == PARKED:
                await self.scheduler.drop_group(group_id)
        self.groups.update(groups)
        self.by_example.update({start + i: members for i, members in enumerate(groups.values())})
        self.step_examples = set(range(start, start + len(groups)))
        self.job = job

    async def publish_checkpoint(self, step: int, timeout_s: float = 60.0) -> int:
        """The trainer's checkpoint `step` published (its STABLE marker), then waited for until the scheduler's
        policy-update loop has applied it (it looks once a second); the checkpoint the scheduler holds."""
        from prime_rl.utils.pathing import get_broadcast_dir, get_step_path

        if step > self.scheduler.ckpt_step:
            folder = get_step_path(get_broadcast_dir(self.output_dir), step)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "STABLE").touch()
            deadline = asyncio.get_running_loop().time() + timeout_s
            while self.scheduler.ckpt_step < step:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"prime-rl's scheduler did not apply checkpoint {step} within {timeout_s:g} s "
                                       f"(it holds {self.scheduler.ckpt_step})")
                await asyncio.sleep(0.05)
        return self.scheduler.ckpt_step

    def _observe(self, info: dict[str, Any], outputs: list[dict[str, Any]], policy: str | None = None) -> None:
        self.attempts[info[GROUP_KEY]] = self.attempts.get(info[GROUP_KEY], 0) + 1
        for output in outputs:
            self.last[info_of(output)[STATE_KEY]] = output
            self.policy[info_of(output)[STATE_KEY]] = policy

    async def generate(self, emit: Emit, step: int = 0) -> None:
        batch = asyncio.ensure_future(self.scheduler.generate_batch(step=step))
        exhausted = asyncio.ensure_future(self.buffer.exhausted.wait())
        try:
            await asyncio.wait({batch, exhausted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exhausted.cancel()
        if not batch.done():  # every group finished or given up, and the batch cannot fill: the bench ends it
            batch.cancel()
            await asyncio.gather(batch, return_exceptions=True)
            for eid in sorted(self.buffer.finished & self.step_examples):  # accepted by prime-rl's buffer
                for spec in self.by_example[eid]:
                    if spec.id in self.last:
                        emit(self.record(self.last[spec.id], spec,
                                         "finished; the batch was ended when nothing was left to run"))
            self._emit_given_up(emit)
            return
        error = batch.exception()
        if error is not None:
            for eid in self.buffer.dropped():  # the group the scheduler dropped before raising
                self._emit_group(eid, emit, reason="dropped by the scheduler, which then raised")
            raise error
        returned = batch.result()
        for output in returned:
            self._emit(output, emit, reason="in the batch generate_batch returned")
        self._emit_given_up(emit)

    def _emit_given_up(self, emit: Emit) -> None:
        """Groups the buffer gave up on and not yet reported: each once, at the end of the step that saw it given
        up (over steps, a group of one step may be given up while the next step fills the scheduler)."""
        for eid in self.buffer.given_up:
            if eid not in self.reported:
                self.reported.add(eid)
                self._emit_group(eid, emit, reason=f"given up after {self.buffer.max_redraws} replays")

    def _emit_group(self, eid: int, emit: Emit, *, reason: str) -> None:
        """A group the batch did not return, every member failed: its own error, or the group's first (a member
        that came back clean was thrown away with its group, untrained)."""
        outputs = [(spec, self.last.get(spec.id)) for spec in self.by_example[eid]]
        first = next((o["error"] for _, o in outputs if o is not None and o.get("error")), None)
        for spec, output in outputs:
            if output is None:  # no attempt of it came back to the orchestrator (its env server raised on each)
                emit(SampleRecord(spec.id, spec.group, "failed", status="group dropped",
                                  prompt_length=len(spec.prompt_ids), error=error_info(first) or ErrorInfo(
                                      "NoOutput", f"{reason}; no attempt of it returned a rollout", ""),
                                  details={"group_attempts": self.attempts.get(spec.group, 0), "reported": reason}))
                continue
            record = self.record(output, spec, reason)
            if record.outcome != "failed":
                record = dataclasses.replace(record, outcome="failed", status="group dropped", error=error_info(first))
            emit(record)

    def _emit(self, output: dict[str, Any], emit: Emit, *, reason: str) -> None:
        spec = self._spec(info_of(output)[STATE_KEY])
        emit(self.record(output, spec, reason))

    def _spec(self, trajectory: str) -> TrajectorySpec:
        for members in self.groups.values():
            for spec in members:
                if spec.id == trajectory:
                    return spec
        raise KeyError(f"prime-rl returned a rollout for {trajectory!r}, which is not in the job")

    def record(self, output: dict[str, Any], spec: TrajectorySpec, reason: str) -> SampleRecord:
        """The rollout's record, carrying the checkpoint prime-rl sent it under (its weight version)."""
        record = record_of(output, spec, details={"group_attempts": self.attempts.get(spec.group, 0),
                                                  "reported": reason})
        policy = self.policy.get(spec.id)
        return record if policy is None else dataclasses.replace(record, weight_versions=[policy])

    async def stop(self) -> None:
        """The scheduler's in-flight rollouts cancelled, the env client closed, the env server terminated."""
        try:
            await self.scheduler.stop()
        finally:
            for env in self.train_envs:
                if env._env_client is not None:
                    await env._env_client.close()
            await asyncio.to_thread(self.train_envs.shutdown)


def _rows(groups: dict[str, list[TrajectorySpec]], facts: TraceFacts, start: int = 0) -> list[dict[str, Any]]:
    """One dataset row per group: its prompt, answer and members, in the job's order (the example id, numbered
    from `start`: a later step's groups follow the earlier steps')."""
    rows = []
    for index, (group, members) in enumerate(groups.items(), start):
        first = members[0]
        if not first.messages:
            raise ValueError(f"trajectory {first.id}: the prime-rl target needs the prompt as chat messages "
                             "(the trace's prompt.messages); this trajectory has only token ids")
        info = {GROUP_KEY: group, MEMBERS_KEY: [m.id for m in members]}
        rows.append({"prompt": first.messages, "answer": facts.answers.get(first.id, ""), "example_id": index,
                     "info": json.dumps(info)})
    return rows


def _config_fields(job: RolloutJob, size: int, rows: Path, scratch: Path, options: dict[str, Any]) -> dict[str, Any]:
    """prime-rl's `OrchestratorConfig` for one batch of the whole job: every group in flight at once."""
    params = job.trajectories[0].sampling_params
    sampling: dict[str, Any] = {"temperature": params.get("temperature", 1.0)}
    if params.get("max_new_tokens") is not None:
        sampling["max_completion_tokens"] = params["max_new_tokens"]
    fields: dict[str, Any] = {
        "train": {"env": [{"id": environment.ENV_ID, "name": ENV_NAME, "args": {"rows": str(rows)},
                           "num_workers": 1}],
                  "sampling": sampling},
        "batch_size": len(job.trajectories), "rollouts_per_example": size,
        "max_inflight_rollouts": len(job.trajectories),
        # one batch: no weight update is ever waited for; over steps prime-rl's default (1) unless given
        "max_async_level": int(options.get("max_async_level", MAX_ASYNC_LEVEL if job.steps > 1 else 10**9)),
        "seq_len": job.context_length, "use_renderer": False, "output_dir": scratch / "outputs",
    }
    if "max_error_reschedule_attempts" in options:
        fields["max_error_reschedule_attempts"] = int(options["max_error_reschedule_attempts"])
    return fields
