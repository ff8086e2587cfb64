"""A tool-calling agent on AReaL's `ArealOpenAI` client: AReaL's path for agentic RL (imported in its environment).

AReaL 1.0.4 ships no tool loop of its own: its agentic examples (multi_turn_math, the search agent, tau2)
are a `RolloutWorkflow` whose `arun_episode` makes an `ArealOpenAI(engine=engine, tokenizer=...)`, runs the
user's agent through `client.chat.completions.create(messages=..., tools=...)`, appends each reply
(`message.model_dump()`) and the tool messages, sets the reward and returns
`client.export_interactions(style=...)`; AReaL's executor turns what that exports into training tensors
(`InteractionWithTokenLogpReward.to_tensor_dict`, `concat_padded_tensors`). The agent here is that loop
and nothing more; everything it calls is AReaL's: the chat template and prompt building
(`chat_template_type="concat"`: each turn's prompt is the parent's served tokens, an EOS and the newly
rendered messages), the tool-call parser (sglang's, `tool_call_parser="qwen"`, AReaL's default), the
engine's `agenerate` (retries, resumption after an abort), the interaction cache that links each turn to
its parent, and the loss mask and logprobs of the exported leaf.

The tools are the trace's (`RecordedTools`): each call gets the output recorded for it, and the
`oversized_tool_output` fault's command its n bytes. The loop stops when a reply calls no tool, ends on
`length`, or the recorded number of turns is reached. The reward is computed in AReaL's reward process
pool (`AsyncRewardWrapper(rewards.score)`, which raises on a poisoned reply) over every reply of the
episode, and defaults to the reward the trace recorded.

Export style `concat` (AReaL's multi-turn examples' choice) makes one sample per episode: the whole
conversation, tool outputs under loss mask 0. `individual` (the `AgentConfig` default, one sample per
turn) is not driven: a bench sample is a trajectory.
"""

from __future__ import annotations

import json
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from areal.api import AsyncRewardWrapper, RolloutWorkflow
from areal.experimental.openai import ArealOpenAI
from areal.infra import workflow_context
from areal.utils.dynamic_import import import_from_string

from bench.records.sample import ErrorInfo
from bench.targets.recorded_tools import RecordedTools

from .naming import episode_scope, name_requests_of
from .target import INDEX_KEY, REWARD_KEY, TRAJECTORY_KEY
from .workflow import Episodes

EXPORT_STYLE = "concat"
CHAT_TEMPLATE_TYPE = "concat"  # what AReaL's examples pair with export style "concat"


@dataclass(frozen=True)
class AgentSettings:
    """What the user configures: sampling, AReaL's client options, the tools."""

    max_completion_tokens: int
    temperature: float
    engine_max_tokens: int | None  # AgentConfig.engine_max_tokens: prompt + completion cap (None: AReaL's default)
    tool_call_parser: str  # AgentConfig.tool_call_parser


class ToolAgentWorkflow(RolloutWorkflow):
    """One episode = one trajectory's conversation with tools, exported by AReaL as one concatenated sample."""

    def __init__(self, reward_path: str, tokenizer: Any, tools: RecordedTools, settings: AgentSettings,
                 episodes: Episodes) -> None:
        self.reward_path, self.tokenizer, self.tools = reward_path, tokenizer, tools
        self.settings, self.episodes = settings, episodes
        self._reward: AsyncRewardWrapper | None = None

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any]:
        index, trajectory = int(data[INDEX_KEY]), str(data[TRAJECTORY_KEY])
        name_requests_of(await workflow_context.get_aiohttp_session())
        with episode_scope(trajectory):
            try:
                return await self._episode(engine, data, index, trajectory)
            except BaseException as error:
                self.episodes.errors[index] = ErrorInfo.of(error)
                raise

    async def _episode(self, engine: Any, data: dict[str, Any], index: int, trajectory: str) -> dict[str, Any]:
        if self._reward is None:  # loaded by path in the executor, as AReaL's workflows do
            self._reward = AsyncRewardWrapper(import_from_string(self.reward_path))
        client = ArealOpenAI(engine=engine, tokenizer=self.tokenizer, chat_template_type=CHAT_TEMPLATE_TYPE,
                             engine_max_tokens=self.settings.engine_max_tokens,
                             tool_call_parser=self.settings.tool_call_parser)
        messages: list[dict[str, Any]] = deepcopy(data["messages"])
        tools = data["tools"]
        replies: list[str] = []
        for turn in range(int(data["turns"])):
            completion = await client.chat.completions.create(
                messages=messages, tools=tools, max_completion_tokens=self.settings.max_completion_tokens,
                temperature=self.settings.temperature)
            choice = completion.choices[0]
            messages.append(choice.message.model_dump(exclude_none=True))
            replies.append(choice.message.content or "")
            calls = choice.message.tool_calls or []
            if not calls or choice.finish_reason == "length" or turn + 1 == int(data["turns"]):
                break
            for call in calls:
                output = self.tools.run(trajectory, turn, {"name": call.function.name,
                                                           "arguments": json.loads(call.function.arguments)})
                messages.append({"role": "tool", "content": output, "tool_call_id": call.id})
        reward = await self._reward("", "\n".join(replies), [], [], **data)
        client.set_last_reward(float(reward))
        exported = client.export_interactions(style=EXPORT_STYLE)
        self.episodes.leaves[index] = list(exported.values())
        for leaf in exported.values():  # AReaL's executor converts them next (cached): an error it would raise
            leaf.to_tensor_dict()       # there (a null logprob in `torch.tensor`) is raised here, and noted
        return exported


def agent_data(index: int, spec: Any, reward: float | None) -> dict[str, Any]:
    """The task data of one trajectory (what a dataset row would hold), with the bench's bookkeeping keys."""
    return {"messages": spec.messages, "tools": spec.tools, "turns": spec.turns, INDEX_KEY: index,
            TRAJECTORY_KEY: spec.id, REWARD_KEY: 0.0 if reward is None else float(reward)}
