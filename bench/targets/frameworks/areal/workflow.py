"""AReaL's `RLVRWorkflow`, kept whole, with the bench's bookkeeping around it (imported in AReaL's environment).

`arun_episode` and `_collect_samples` call AReaL's own; the subclass only names the episode's trajectory on
its requests (`naming`), notes which trajectory an episode is (a tensor AReaL concatenates like its own),
the response's finish reason and versions, and the error an episode raised before AReaL turns it into None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
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
