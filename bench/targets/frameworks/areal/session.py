"""AReaL's rollout across training steps (`run --steps K`): one engine and one workflow executor for the whole run,
AReaL's `prepare_batch` once per step (imported in AReaL's environment).

AReaL's trainer (`PPOTrainer.train`, `areal/trainer/rl_trainer.py`) makes its rollout engine once and calls
`prepare_batch(train_dataloader, workflow, ...)` every step (`WorkflowExecutor.prepare_batch`,
`BatchTaskDispatcher.active_submit_and_wait` in `areal/infra/workflow_executor.py`): it keeps taking items from the
dataloader, cycled, while fewer than `(max_head_offpolicyness + 1) x consumer_batch_size` wait to start; the
executor starts one while the staleness manager has room (`StalenessManager.get_capacity`: accepted plus running
samples at most `(max_head_offpolicyness + version + 1) x consumer_batch_size`); the call returns once `batch_size`
accepted results are in, the oldest-started of those finished first (`wait_results`). What was started beyond the
batch generates on, through the trainer's weight sync (`weights`: interrupted, sent again under the new version),
into the next step: the overlap `max_head_offpolicyness` bounds. A dropped episode (its workflow raised: AReaL logs
it and gets None) does not count, and another item is taken in its place.

The bench's dataloader (`Feed`): the job's trajectories in step order, one item each (the bench's samples are the
trace's trajectories, `n_samples` 1), `batch_size` and `consumer_batch_size` a step's slice: step k's slice, then the
later steps' (`job.later`), which AReaL takes ahead of their step as it would the next batches. The bench's data
ends where AReaL's cycles into its next epoch; the bench has no recording for that, so the next epoch's items send
nothing (`workflow.StepWorkflows`): they wait for the job's episodes to end, then come back as placeholders the
adapter drops. A step short of accepted samples once the job's data is spent (AReaL dropped some) thus ends with
what there is, the last of them, where AReaL would take the next epoch's. Records go out when the step that trains
on them returns: the batch's samples, and the episodes AReaL dropped by then (`failed`). The last step tears the
engine down (it cancels the placeholders); so does a step that raised when the run stops on a failed step.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from bench.records.sample import SampleRecord
from bench.targets.base import RolloutJob, TrajectorySpec

from . import rewards, weights
from .target import (
    DISTRIBUTION,
    INDEX_KEY,
    REWARD_KEY,
    TRAJECTORY_KEY,
    _agent_record,
    _failed,
    _record,
    _sampling,
    workflow_of,
)
from .workflow import TAIL_KEY, Episodes, StepWorkflows


@dataclass
class Feed:
    """What AReaL's `prepare_batch` reads as its train dataloader: batches of one step's size, the job's in order,
    then the next epoch's (placeholders) for as long as it asks."""

    batch_size: int
    items: list[dict[str, Any]]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        for start in range(0, len(self.items), self.batch_size):
            yield self.items[start:start + self.batch_size]
        while True:
            yield [{TAIL_KEY: True} for _ in range(self.batch_size)]


@dataclass
class Session:
    """The engine, its executor and what the adapter knows of the job's episodes, from step 0 to the last."""

    job: RolloutJob  # step 0's, with every later step's trajectories
    offpolicyness: int  # AReaL's `max_head_offpolicyness`
    engine: Any = None
    update: Any = None  # the trainer's `WeightUpdateMeta`
    episodes: Episodes = field(default_factory=Episodes)
    specs: list[TrajectorySpec] = field(default_factory=list)
    emitted: set[int] = field(default_factory=set)
    workflow: Any = None
    feed: Feed | None = None
    kind: str = "rlvr"  # `workflow_of(job)`

    def start(self) -> None:
        """AReaL's engine (`RemoteSGLangEngine`, its executor's threads) and the job's data and workflows."""
        from areal.api.cli_args import InferenceEngineConfig
        from areal.engine.sglang_remote import RemoteSGLangEngine
        from transformers import AutoTokenizer

        job = self.job
        self.kind = workflow_of(job)
        self.specs = [*job.trajectories, *job.later]
        size = len(job.trajectories)
        config = InferenceEngineConfig(backend="sglang:d1", tokenizer_path=str(job.tokenizer_path),
                                       max_concurrent_rollouts=job.concurrency, consumer_batch_size=size,
                                       max_head_offpolicyness=self.offpolicyness)
        tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
        items, workflows = workflow_items(job, self.kind, self.specs, tokenizer, self.episodes)
        self.workflow = StepWorkflows(workflows, self.episodes, len(self.specs))
        self.feed = Feed(size, items)
        self.update = weights.meta()
        engine = RemoteSGLangEngine(config)
        address = urlparse(job.base_url)
        engine.initialize(addr=f"{address.hostname}:{address.port}")
        self.engine = engine

    def step(self, job: RolloutJob) -> list[SampleRecord]:
        """One step's `prepare_batch`: the records of what it hands the trainer and of the episodes dropped by then."""
        assert self.engine is not None and self.feed is not None
        first = job.step * self.feed.batch_size
        if [s.id for s in job.trajectories] != [s.id for s in self.specs[first:first + len(job.trajectories)]]:
            raise ValueError(f"areal step {job.step}: its trajectories are not the slice step 0 was given for it")
        batch = self.engine.prepare_batch(self.feed, workflow=self.workflow, should_accept_fn=self.workflow.accept)
        framework = f"areal {importlib.metadata.version(DISTRIBUTION)}"
        taken = [int(result[INDEX_KEY].item()) for result in batch if INDEX_KEY in result]
        records = [self._record(index, batch, framework) for index in taken]
        self.emitted.update(taken)
        last = job.step == job.steps - 1
        dropped = [index for index in range(len(self.specs)) if index not in self.emitted
                   and (index in self.episodes.errors or last)]
        records += [_failed(self.specs[index], self.episodes, index, framework) for index in dropped]
        self.emitted.update(dropped)
        for index in (*taken, *dropped):
            self.episodes.forget(index)
        return records

    def _record(self, index: int, batch: list[dict[str, Any]], framework: str) -> SampleRecord:
        spec = self.specs[index]
        if self.kind == "agent":
            return _agent_record(spec, self.episodes, index, framework)
        result = next(r for r in batch if INDEX_KEY in r and int(r[INDEX_KEY].item()) == index)
        return _record(spec, result, self.episodes, index, framework)

    def sync(self, step: int) -> str:
        """The trainer's side before `step`: joining the weight-update group before step 0, else the sync that
        follows step - 1's training. The engine's version, which the trainer published."""
        assert self.engine is not None
        if step == 0:
            weights.connect(self.engine, self.update)
        else:
            weights.publish(self.engine, self.update, step)
        return str(self.engine.get_version())

    def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.destroy()


def workflow_items(job: RolloutJob, kind: str, specs: list[TrajectorySpec], tokenizer: Any,
          episodes: Episodes) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """Each trajectory's dataloader item and the AReaL workflow it runs in (one per recorded sampling)."""
    from areal.api.cli_args import GenerationHyperparameters

    from .workflow import bench_workflow

    made: dict[tuple[int, float], Any] = {}
    items, workflows = [], {}
    if kind == "agent":
        from bench.targets.recorded_tools import RecordedTools

        from .agent import AgentSettings, ToolAgentWorkflow, agent_data

        tools = RecordedTools.load(Path(job.options["trace"]), specs) if job.options.get("trace") \
            else RecordedTools({}, {})
        limit = job.options.get("engine_max_tokens")
        for index, spec in enumerate(specs):
            if not spec.messages or not spec.tools:
                raise ValueError(f"areal workflow=agent: trajectory {spec.id} has no prompt messages and tools "
                                 "(an agentic trace has both; use workflow=rlvr for single-turn traces)")
            key = _sampling(spec)
            if key not in made:
                settings = AgentSettings(max_completion_tokens=key[0], temperature=key[1],
                                         engine_max_tokens=None if limit is None else int(limit),
                                         tool_call_parser=str(job.options.get("tool_call_parser", "qwen")))
                made[key] = ToolAgentWorkflow(rewards.PATH, tokenizer, tools, settings, episodes)
            items.append(agent_data(index, spec, tools.rewards.get(spec.id)))
            workflows[index] = made[key]
        return items, workflows
    for index, spec in enumerate(specs):
        key = _sampling(spec)
        if key not in made:
            gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=key[0], temperature=key[1])
            made[key] = bench_workflow(rewards.PATH, gconfig, tokenizer, episodes)
        items.append({"messages": spec.messages, INDEX_KEY: index, TRAJECTORY_KEY: spec.id, REWARD_KEY: 1.0})
        workflows[index] = made[key]
    return items, workflows
