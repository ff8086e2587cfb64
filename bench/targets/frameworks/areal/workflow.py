"""AReaL's `RLVRWorkflow`, kept whole, with the bench's bookkeeping around it (imported in AReaL's environment).

`arun_episode` and `_collect_samples` call AReaL's own; the subclass only names the episode's trajectory on
its requests (`naming`), notes which trajectory an episode is (a tensor AReaL concatenates like its own),
the response's finish reason and versions, and the error an episode raised before AReaL turns it into None.
`StepWorkflows` is the one workflow a run of many steps gives AReaL's `prepare_batch` (`session`).
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
from areal.api.workflow_api import RolloutWorkflow
from areal.infra import workflow_context
from areal.workflow.rlvr import RLVRWorkflow

from bench.records.sample import ErrorInfo

from .naming import episode_scope, name_requests_of
from .target import INDEX_KEY, TRAJECTORY_KEY


@dataclass
class Episodes:
    """What the adapter learns per trajectory index, filled from AReaL's executor thread."""

    responses: dict[int, tuple[str | None, list[int]]] = field(default_factory=dict)
    errors: dict[int, ErrorInfo] = field(default_factory=dict)
    leaves: dict[int, list[Any]] = field(default_factory=dict)  # agent: the interactions AReaL exported
    accepted: dict[int, dict[str, Any]] = field(default_factory=dict)  # agent: the tensors AReaL's executor made
    finished: int = 0  # episodes that ended, returned or raised (`StepWorkflows`, a run of many steps)

    def forget(self, index: int) -> None:
        """Drop what was kept for a trajectory whose record went out (a run of many steps keeps only the rest)."""
        for kept in (self.responses, self.errors, self.leaves, self.accepted):
            kept.pop(index, None)

    def accept(self, index: int) -> Any:
        """A `should_accept_fn` for one submission: keeps every episode, and notes the tensors AReaL made of it."""
        def note(trajectory: dict[str, Any]) -> bool:
            self.accepted[index] = trajectory
            return True
        return note


def bench_workflow(reward_path: str, gconfig: Any, tokenizer: Any, episodes: Episodes) -> RLVRWorkflow:
    class BenchRLVR(RLVRWorkflow):
        async def _collect_samples(self, engine: Any, req: Any, prompt_str: str,
                                   task_data: dict[str, Any]) -> tuple[Any, float]:
            resp, reward = await super()._collect_samples(engine, req, prompt_str, task_data)
            episodes.responses[int(task_data[INDEX_KEY])] = (resp.stop_reason, list(resp.output_versions))
            return resp, reward

        async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor]:
            name_requests_of(await workflow_context.get_aiohttp_session())
            with episode_scope(str(data[TRAJECTORY_KEY])):
                try:
                    result = await super().arun_episode(engine, data)
                except BaseException as error:
                    episodes.errors[int(data[INDEX_KEY])] = ErrorInfo.of(error)
                    raise
            result[INDEX_KEY] = torch.tensor([int(data[INDEX_KEY])])
            return result

    return BenchRLVR(reward_fn=reward_path, gconfig=gconfig, tokenizer=tokenizer)


TAIL_KEY = "bench_next_epoch"
TAIL_POLL_S = 0.05
_EPISODE_INDEX: contextvars.ContextVar[int | None] = contextvars.ContextVar("rollout_bench_areal_index", default=None)


class StepWorkflows(RolloutWorkflow):
    """The one workflow AReaL's `prepare_batch` takes (it keeps the first call's for every step), handing each
    trajectory to the AReaL workflow made for its sampling parameters; `episodes.finished` counts those that ended.

    An item past the job's data (`TAIL_KEY`, the next epoch's prompt, which the bench has no recording for) sends
    nothing: it waits until every episode of the job has ended, then comes back as a placeholder the adapter drops,
    so that a last step short of accepted samples (an episode AReaL dropped) still ends (`session`)."""

    def __init__(self, workflows: dict[int, RolloutWorkflow], episodes: Episodes, total: int) -> None:
        self.workflows, self.episodes, self.total = workflows, episodes, total

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        if TAIL_KEY in data:
            while self.episodes.finished < self.total:
                await asyncio.sleep(TAIL_POLL_S)
            return {TAIL_KEY: torch.tensor([1])}
        index = int(data[INDEX_KEY])
        _EPISODE_INDEX.set(index)  # read by `accept`, which AReaL's executor calls next in this task
        try:
            return await self.workflows[index].arun_episode(engine, data)
        finally:
            self.episodes.finished += 1

    def accept(self, trajectory: dict[str, Any]) -> bool:
        """The `should_accept_fn`: keeps every episode, noting which trajectory AReaL made the tensors of."""
        index = _EPISODE_INDEX.get()
        if TAIL_KEY in trajectory or index is None:
            return True
        self.episodes.accepted[index] = trajectory
        trajectory.setdefault(INDEX_KEY, torch.tensor([index]))
        return True
