"""The tool sandbox, replayed: every target that runs tools (the reference tool loop, the slime family's and
verifiers' adapters) answers a tool call with the output the trace recorded for it, never by running it.

The one exception is the `oversized_tool_output` fault's command (`faults.hooks.emit_command(n)`): its output
is exactly n bytes, produced here without a shell.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.trace import open_trace
from faults.hooks import CODE_TOOLS, emit_code, emit_command

from .base import TrajectorySpec

_SIZE = "123456789"
_EMIT = re.compile(re.escape(emit_command(int(_SIZE))).replace(_SIZE, r"(\d+)"))
_EMIT_CODE = re.compile(re.escape(emit_code(int(_SIZE))).replace(_SIZE, r"(\d+)"))


class RecordedTools:
    """The tool sandbox, replayed: each call gets the output the trace recorded for it."""

    def __init__(self, outputs: dict[str, list[list[tuple[str, dict[str, Any], str]]]],
                 rewards: dict[str, float | None], groups: dict[str, str] | None = None) -> None:
        self._outputs = outputs  # trajectory -> turn -> [(tool name, arguments, output text)]
        self.rewards = rewards
        # trajectory -> group: members of a group send identical first requests, and a server that tells them apart
        # only by arrival order (through a router, which drops the bench's headers) may hand one member another's
        # answer; that member then makes the other's tool calls, which the sandbox answers as recorded for them
        self._members: dict[str, list[str]] = {}
        for trajectory, group in (groups or {}).items():
            self._members.setdefault(group, []).append(trajectory)
        self._group_of = dict(groups or {})

    @classmethod
    def load(cls, path: str | Path, specs: list[TrajectorySpec]) -> "RecordedTools":
        """Read the job's trajectories from the trace (those whose prompt matches the job's)."""
        wanted = {spec.id: spec for spec in specs}
        outputs: dict[str, list[list[tuple[str, dict[str, Any], str]]]] = {}
        rewards: dict[str, float | None] = {}
        with open_trace(path, check=False) as reader:
            for number, line in reader.lines():
                if reader.ids(number, line)[0] not in wanted:  # the others are skipped undecoded
                    continue
                trajectory = reader.decode(number, line)
                spec = wanted.get(trajectory.id)
                if spec is None or list(trajectory.prompt.ids) != list(spec.prompt_ids):
                    continue
                turns = []
                for turn in trajectory.turns:
                    texts = {out.call_id: out.text for out in turn.tool_outputs}
                    turns.append([(call.name, json.loads(call.arguments), texts.get(call.id, ""))
                                  for call in turn.tool_calls])
                outputs[trajectory.id] = turns
                rewards[trajectory.id] = trajectory.reward
        return cls(outputs, rewards, {spec.id: spec.group for spec in specs})

    def run(self, trajectory: str, turn: int, call: dict[str, Any]) -> str:
        """The output of one tool call made at `turn` of `trajectory`."""
        command = call["arguments"].get("command")
        if call["name"] == "bash" and isinstance(command, str):
            emitted = _EMIT.fullmatch(command.strip())
            if emitted:
                return "x" * int(emitted.group(1))  # what `head -c N /dev/zero | tr '\0' x` prints
        code = call["arguments"].get(CODE_TOOLS.get(call["name"], ""))
        if isinstance(code, str):
            emitted = _EMIT_CODE.fullmatch(code.strip())
            if emitted:
                return "x" * int(emitted.group(1)) + "\n"  # what `print('x' * N)` prints
        members = self._members.get(self._group_of.get(trajectory, ""), [])
        for member in [trajectory, *(m for m in members if m != trajectory)]:
            turns = self._outputs.get(member, [])
            for name, arguments, text in turns[turn] if turn < len(turns) else []:
                if name == call["name"] and arguments == call["arguments"]:
                    return text
        return f"error: tool {call['name']!r} failed: no such call in this sandbox"
