"""verl 0.9.1's v1 sync trainer (`verl.trainer.ppo.v1`, the current release) as the run drives it.

What runs is verl's: the prompts registered in TransferQueue as `pending` (what `PPOTrainer.
_submit_batch_to_rollout` does in sync mode), `AgentLoopManagerTQ.generate_sequences`, `AgentLoopWorkerTQ`'s
methods in Ray actors (`_run_prompt` marks the root `running`, settles every session, then writes it
`finished` or `failure`; `_agent_loop_postprocess` writes each session's row), verl's `SingleTurnAgentLoop`,
`LLMServerClient` and load balancer, and the sync `ReplayBuffer`, built with the arguments
`PPOTrainer._build_replay_buffer` gives it by default (no DAPO filter, `sync_refill_failed_groups` off).
Its `sample()` takes terminal roots, `finished` or `failure`, as sampleable; with the default settings a
`failure` root is neither evicted nor refilled, so the rows its surviving sessions wrote are trained on.

Across steps (`run --steps K`) one manager and one buffer serve every step, as in `PPOTrainer.fit`: each step's
prompts carry its `global_steps`, and after the step the trainer clears the batch's rows from TransferQueue
(`fit`, its cleanup; `sample()` cleared the roots). The trainer's weight sync names the step its weights come from
(`PUBLISHES_GLOBAL_STEPS`: `PPOTrainerSync.on_init_end` and `on_step_end`).

`FailClosedReplayBuffer` is the `patched` variant, the same fail-closed rule as for 0.8.0: a selected root
that ended `failure`, or with fewer successful sessions than it expected, leaves the batch.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from .common import MEMBERS_KEY, SessionBookkeeping, StartsBenchWorkers, adopt_methods, complete_groups


class _BenchAgentLoopWorker(SessionBookkeeping):
    """verl 0.9.1's `AgentLoopWorkerTQ`: its methods (adopted below) with the bench's bookkeeping."""


BenchAgentLoopWorker = adopt_methods(_BenchAgentLoopWorker, AgentLoopWorkerTQ)


class BenchManager(StartsBenchWorkers, AgentLoopManagerTQ):
    """verl's manager, starting the bench's worker class."""

    bench_workers = BenchAgentLoopWorker


class FailClosedReplayBuffer(ReplayBuffer):
    """`patched`: the batch never holds a partial group; refused roots are kept in `rejected`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected: dict[str, int] = {}  # uid -> sessions dispatched (rollout.n for that prompt)
        self.rejected: dict[str, str] = {}
        self.left_out: list[str] = []  # rows of refused groups, cleared with the batch's once the step is done

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str],
                           partition_snapshot: dict[str, dict]) -> Any:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        roots = {uid: ("failure" if uid in self.failure_keys[partition_id] else "finished", self.expected.get(uid, 0))
                 for uid in selected_prompt_uids}
        keys, tags = complete_groups(batch.keys, batch.tags, roots, self.rejected)
        kept = set(keys)
        self.left_out.extend(key for key in batch.keys if key not in kept)
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags)


def _no_refill(count: int) -> int:
    raise RuntimeError(f"verl's replay buffer asked for {count} more prompts; the bench's step has no more")


PUBLISHES_GLOBAL_STEPS = True  # `PPOTrainerSync` passes `global_steps` to every weight sync


class Rollout:
    """A step's dispatch and sample, as 0.9.1's sync `PPOTrainer` does them, and the cleanup `fit` makes after it."""

    def __init__(self, config: Any, variant: str, llm_client: Any, poll_s: float) -> None:
        self.config, self.poll_s, self.variant = config, poll_s, variant
        self.buffer: Any = None
        self.manager = BenchManager.create(config, llm_client=llm_client)
        self.workers = self.manager.agent_loop_workers

    @staticmethod
    def balancer(servers: dict[str, Any]) -> Any:
        import ray

        return ray.remote(GlobalRequestLoadBalancer).remote(servers=servers)

    def dispatch(self, prompts: Any, step: int) -> None:
        uids = list(prompts["uid"])
        if self.buffer is None:  # built once, as `PPOTrainer._build_replay_buffer` (the batch sizes: the first step's)
            sampler = self.config.trainer.v1.sampler
            kind = FailClosedReplayBuffer if self.variant == "patched" else ReplayBuffer
            self.buffer = kind(trainer_mode="sync", trainer_config=self.config.trainer.v1.get("sync", {}),
                               max_off_policy_threshold=sampler.max_off_policy_threshold,
                               max_off_policy_strategy=sampler.max_off_policy_strategy,
                               sampler_kwargs=sampler.sampler_kwargs, poll_interval=self.poll_s, refill_fn=_no_refill,
                               filter_groups_metric=None, sync_refill_failed_groups=False,
                               train_batch_size=len(uids), gen_batch_size=len(uids), max_inflight_gen_batches=1)
        if isinstance(self.buffer, FailClosedReplayBuffer):
            self.buffer.expected.update({uid: len(str(members).split("|"))
                                         for uid, members in zip(uids, prompts[MEMBERS_KEY], strict=True)})
        tq.kv_batch_put(keys=uids, partition_id="train",
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids])
        self.manager.generate_sequences(prompts)

    def sample(self, step: int, groups: int) -> Any:
        batch, _metrics = self.buffer.sample(global_steps=step, partition_id="train", batch_size=groups)
        return batch

    def finish_step(self, batch: Any) -> None:
        """`fit` after a step: the batch's rows out of TransferQueue (`patched`: its refused rows too)."""
        keys = list(batch.keys) + list(getattr(self.buffer, "left_out", []))
        if keys:
            tq.kv_clear(keys=keys, partition_id="train")
        if isinstance(self.buffer, FailClosedReplayBuffer):
            self.buffer.left_out.clear()

    def running(self) -> list[str]:
        if self.buffer is None:
            return []
        return sorted(self.buffer.pending_keys["train"] | self.buffer.running_keys["train"])

    @property
    def rejected(self) -> dict[str, str]:
        return dict(getattr(self.buffer, "rejected", {}))

    def close(self) -> None:
        """The v1 buffer polls inside `sample()` only: no thread to stop."""
