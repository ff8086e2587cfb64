"""The target adapter interface: run real rollout code, hand back sample records.

An adapter receives a `RolloutJob` (the trajectories to run with their prompts, group
structure and sampling parameters, the server's URL, the context budget, client-side fault
rules) and calls `emit` once per trajectory with its `SampleRecord`. If the rollout code
raises out of `run`, that is a result too (the batch crashed): the runner records it, marks
the trajectories that never came back as lost, and never crashes itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from bench.records.sample import SampleRecord
from faults import Rule

Emit = Callable[[SampleRecord], None]


@dataclass(frozen=True)
class TrajectorySpec:
    id: str
    group: str
    prompt_ids: list[int]
    prompt_text: str
    messages: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    sampling_params: dict[str, Any]
    turns: int  # recorded turns: a multi-turn target stops there
    raw_prompt: str | None = None  # what the framework receives when it renders the prompt itself (`prompt.raw`)


@dataclass
class RolloutJob:
    base_url: str
    trajectories: list[TrajectorySpec]
    context_length: int
    tokenizer_path: Path
    concurrency: int = 64
    seed: int = 0
    client_faults: list[Rule] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    # `run --steps K`: the rollout is called K times in one process, each call with its step's trajectories and
    # `step` 0 to K-1 (slime's `rollout_id`, prime-rl's `step`); an adapter that ignores `step` still works
    step: int = 0
    steps: int = 1
    on_step_failure: str = "stop"  # "continue": a step that raised is followed by the next one, same process
    # the trajectories of the steps after this one, in order (empty in a one-step run): a rollout that generates
    # ahead of training (AReaL's `prepare_batch`) submits them before their step; their records still go out
    # when a step hands them to the trainer
    later: list[TrajectorySpec] = field(default_factory=list)

    def for_step(self, step: int) -> "RolloutJob":
        """The job of one step: its equal slice of the trajectories (the bench checked they divide evenly)."""
        size = len(self.trajectories) // self.steps
        return dataclasses.replace(self, trajectories=self.trajectories[step * size:(step + 1) * size], step=step,
                                   later=self.trajectories[(step + 1) * size:size * self.steps])

    def groups(self) -> dict[str, list[TrajectorySpec]]:
        grouped: dict[str, list[TrajectorySpec]] = {}
        for spec in self.trajectories:
            grouped.setdefault(spec.group, []).append(spec)
        return grouped


class TargetAdapter(Protocol):
    """What the runner needs from a target.

    Optional, looked up with getattr: `variants` (a class attribute), `warm_up(options)` (slow imports, before
    the job arrives; in the worker, never before a fork it cannot survive), `tokens_source` ("served" or
    "retokenized"), `prepare(job)` (the framework's own start-up for this job, such as a Ray runtime and its
    actors: called in a thread before `run`, not counted as a stall; `run` then owns the teardown),
    `framework_info()` (a str -> str mapping the report writes under `framework`: the
    installed version, or the source checkout and its commit; called after `warm_up`) and
    `async update_weights(job) -> str | None` (the framework's trainer side: in a run of many steps, awaited before
    every step; it publishes the step's weights through the server's admin routes as the trainer does and returns
    the version it published; the bench then publishes none itself, `bench.steps`).
    """

    name: str
    fail_fast: bool  # the framework's declared policy: one failure fails the batch, loudly

    async def run(self, job: RolloutJob, emit: Emit) -> None: ...
