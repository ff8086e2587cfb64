"""verl 0.8.0's sync trainer (`verl.trainer.main_ppo_sync`, the base of verl#6641) as the run drives it.

What runs is verl's: `AgentLoopManagerTQ.generate_sequences` (root markers `running` in the trainer's
`ReplayBuffer`, the batch split across the workers), `AgentLoopWorkerTQ`'s methods in Ray actors
(`_run_prompt` gathers a group's sessions and writes the root `finished` or `failure` to TransferQueue;
`_agent_loop_postprocess` writes each session's row `{uid}_{session}_{index}` with status `success`),
verl's `SingleTurnAgentLoop`, `LLMServerClient` and `GlobalRequestLoadBalancer`, and `ReplayBuffer.sample()`,
which waits until no root of the step is `running` and returns the `success` rows (root statuses unread).

Across steps (`run --steps K`) one manager and one buffer serve every step, as in `PPOTrainer.fit`: each step's
prompts carry its `global_steps`, `sample()` waits for that step's roots only, and after the step the trainer
clears the batch's rows from TransferQueue and the buffer (`fit`, its cleanup). The roots' own entries stay, as
verl leaves them. verl's `fit` passes no `global_steps` to its weight sync (`PUBLISHES_GLOBAL_STEPS`).

`FailClosedReplayBuffer` is the `patched` variant: our own fail-closed `sample()` for the pattern verl#6641
fixes. A root that ended `failure`, or `finished` with fewer successful sessions (unique session ids, not
rows) than it expected, is not trained on: its keys leave the batch and the refusal is kept in `rejected`.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.main_ppo_sync import AgentLoopManagerTQ, AgentLoopWorkerTQ, KVBatchMeta, ReplayBuffer
from verl.workers.rollout.llm_server import GlobalRequestLoadBalancer

import transfer_queue as tq

from .common import EXPECTED_KEY, MEMBERS_KEY, SessionBookkeeping, StartsBenchWorkers, adopt_methods, complete_groups


class _BenchAgentLoopWorker(SessionBookkeeping):
    """verl 0.8.0's `AgentLoopWorkerTQ`: its methods (adopted below) with the bench's bookkeeping."""


BenchAgentLoopWorker = adopt_methods(_BenchAgentLoopWorker, AgentLoopWorkerTQ)


class BenchManager(StartsBenchWorkers, AgentLoopManagerTQ):
    """verl's manager, starting the bench's worker class and noting each root's expected session count."""

    bench_workers = BenchAgentLoopWorker

    def generate_sequences(self, prompts: Any) -> None:
        expected = {uid: {EXPECTED_KEY: len(str(members).split("|"))}
                    for uid, members in zip(prompts["uid"], prompts[MEMBERS_KEY], strict=True)}
        self.replay_buffer.add("train", expected)
        super().generate_sequences(prompts)


class FailClosedReplayBuffer(ReplayBuffer):
    """`patched`: `sample()` never returns a partial group; refused roots are kept in `rejected`."""

    def __init__(self, poll_interval: float = 1.0) -> None:
        super().__init__(poll_interval=poll_interval)
        self.rejected: dict[str, str] = {}  # uid -> why it was not trained on
        self.left_out: list[str] = []  # rows of refused groups, cleared with the batch's once the step is done

    def sample(self, partition_id: str, global_steps: int | None = None, batch_size: int | None = None) -> Any:
        batch = super().sample(partition_id, global_steps=global_steps, batch_size=batch_size)
        with self.lock:
            roots = {key: (tag["status"], int(tag.get(EXPECTED_KEY, 0)))
                     for key, tag in self.partitions[partition_id].items()
                     if "_" not in key and tag.get("global_steps") == global_steps}
        keys, tags = complete_groups(batch.keys, batch.tags, roots, self.rejected)
        kept = set(keys)
        self.left_out.extend(key for key in batch.keys if key not in kept)
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags)


PUBLISHES_GLOBAL_STEPS = False  # `fit` calls `checkpoint_manager.update_weights()` with no step


class Rollout:
    """A step's dispatch and sample, as 0.8.0's `PPOTrainer.step` does them, and the cleanup `fit` makes after it."""

    def __init__(self, config: Any, variant: str, llm_client: Any, poll_s: float) -> None:
        self.buffer = (FailClosedReplayBuffer if variant == "patched" else ReplayBuffer)(poll_s)
        self.manager = BenchManager.create(config, llm_client=llm_client, replay_buffer=self.buffer)
        self.workers = self.manager.agent_loop_workers

    @staticmethod
    def balancer(servers: dict[str, Any]) -> Any:
        return GlobalRequestLoadBalancer.remote(servers=servers)

    def dispatch(self, prompts: Any, step: int) -> None:
        self.manager.generate_sequences(prompts)

    def sample(self, step: int, groups: int) -> Any:
        return self.buffer.sample(partition_id="train", global_steps=step)

    def finish_step(self, batch: Any) -> None:
        """`fit` after a step: the batch's rows out of TransferQueue and the buffer (`patched`: refused rows too)."""
        keys = list(batch.keys) + list(getattr(self.buffer, "left_out", []))
        if keys:
            tq.kv_clear(keys=keys, partition_id="train")
        self.buffer.remove("train", keys)
        if isinstance(self.buffer, FailClosedReplayBuffer):
            self.buffer.left_out.clear()

    def running(self) -> list[str]:
        with self.buffer.lock:
            return [key for key, tag in self.buffer.partitions["train"].items() if tag.get("status") == "running"]

    @property
    def rejected(self) -> dict[str, str]:
        return dict(getattr(self.buffer, "rejected", {}))

    def close(self) -> None:
        self.buffer.close()
