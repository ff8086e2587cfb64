"""The plug-ins slime and miles load by dotted path while the bench runs their rollout code.

Both frameworks take user code through their own switches: `--custom-generate-function-path`,
`--custom-rm-path`, and for miles' multi-turn generator `--generate-tool-specs-path` and
`--generate-execute-tool-function-path`. The adapter (`family.py`) points those
switches here, so everything between them stays the framework's own code:

- `generate` wraps the generate function that would run anyway (the framework's default, or
  the user's `custom_generate_function_path`) and names the sample's trajectory for the rest
  of its task: the HTTP client then tells the bench server which trajectory each request is
  (`X-Bench-Trajectory`), which makes fault decisions exact at any concurrency, and the tool
  executor knows whose tool call it is running.
- `reward` is the post-processing step where seed mode 000 strikes: it calls
  `faults.hooks.raise_if_poisoned` on the reply, then scores it (the user's reward function
  if one was given, else the reward the trace recorded).
- `TOOL_SPECS` and `execute_tool` replay the trace's tools: each call gets the output the
  trace recorded for it, or what `faults.hooks.emit_command` prints (`oversized_tool_output`).

`configure()` installs one run's settings; each worker process runs one job at a time.
"""

from __future__ import annotations

import contextvars
import inspect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from bench.records.attribution import TRAJECTORY_HEADER
from bench.targets.recorded_tools import RecordedTools
from faults.hooks import raise_if_poisoned

META_KEY = "rollout_bench"  # the key of our entry in `Sample.metadata`

# Object paths handed to the framework (it imports this module by name and takes these attributes).
MODULE = __name__
GENERATE_PATH = f"{MODULE}.generate"
REWARD_PATH = f"{MODULE}.reward"
TOOL_SPECS_PATH = f"{MODULE}.TOOL_SPECS"
EXECUTE_TOOL_PATH = f"{MODULE}.execute_tool"

TOOL_SPECS: list[dict[str, Any]] = []  # filled in place by `configure` (the framework loads it by path)

InnerGenerate = Callable[[Any, Any, dict[str, Any], bool], Awaitable[Any]]


@dataclass
class Attempt:
    """One generate call of one trajectory: the requests it made (one per turn)."""

    trajectory: str
    requests: int = 0


@dataclass
class Settings:
    """What one run plugs in."""

    inner_generate: InnerGenerate  # the generate function the framework would run without us
    inner_reward: Callable[..., Any] | None = None  # the user's `custom_rm_path`, if any
    tools: RecordedTools | None = None
    rewards: dict[str, float | None] = field(default_factory=dict)  # recorded reward per trajectory
    # trajectory -> turn -> requests made at that turn, over every generate call (the attempt numbers)
    turn_requests: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    last_turn: dict[str, int] = field(default_factory=dict)  # trajectory -> turn of its latest request
    generate_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # trajectory -> calls (resubmissions)


_settings: Settings | None = None
_current: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("rollout_bench_attempt", default=None)


def configure(settings: Settings, tool_specs: list[dict[str, Any]]) -> None:
    global _settings
    _settings = settings
    TOOL_SPECS[:] = tool_specs


def settings() -> Settings:
    if _settings is None:
        raise RuntimeError(f"{MODULE} was loaded by the framework before the bench adapter configured it")
    return _settings


def trajectory_of(sample: Any) -> str:
    """The trace trajectory a framework `Sample` stands for (from the entry the adapter put in its metadata)."""
    entry = (sample.metadata or {}).get(META_KEY)
    if not entry:
        raise KeyError(f"sample index {sample.index} carries no {META_KEY!r} metadata: not fed by the bench adapter")
    if "trajectory" in entry:
        return str(entry["trajectory"])
    return str(entry["members"][sample.index - entry["first_index"]])  # eval: one row per group, n samples each


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """`--custom-generate-function-path`: the framework's own generate, with the trajectory named for this task."""
    trajectory = trajectory_of(sample)
    config = settings()
    config.generate_calls[trajectory] += 1
    _current.set(Attempt(trajectory))
    return await config.inner_generate(args, sample, sampling_params, evaluation)


async def reward(args: Any, sample: Any, **kwargs: Any) -> Any:
    """`--custom-rm-path`: post-processing that raises on a poisoned reply, as a crashing parser or scorer would."""
    raise_if_poisoned(sample.response)
    config = settings()
    if config.inner_reward is not None:
        result = config.inner_reward(args, sample, **kwargs)
        return await result if inspect.isawaitable(result) else result
    recorded = config.rewards.get(trajectory_of(sample))
    return float(recorded) if recorded is not None else 0.0


async def execute_tool(name: str, params: dict[str, Any]) -> str:
    """`--generate-execute-tool-function-path`: the trace's recorded output for this call of this turn."""
    attempt = _current.get()
    config = settings()
    if attempt is None or config.tools is None:
        return f"error: tool {name!r} failed: no sandbox for this sample"
    turn = max(attempt.requests - 1, 0)  # the tool calls come from the reply to the latest request
    return config.tools.run(attempt.trajectory, turn, {"name": name, "arguments": params})


async def name_request(request: Any) -> None:
    """httpx request hook on the framework's client: say which trajectory (and count its turns)."""
    attempt = _current.get()
    if attempt is None or not request.url.path.endswith("/generate"):
        return
    request.headers[TRAJECTORY_HEADER] = attempt.trajectory
    turn = attempt.requests
    attempt.requests += 1
    if _settings is not None:
        _settings.turn_requests[attempt.trajectory][turn] += 1
        _settings.last_turn[attempt.trajectory] = turn


def aborted_at(trajectory: str) -> tuple[int, int] | None:
    """(turn, attempt) of the trajectory's latest request: where an ABORTED sample stopped."""
    config = settings()
    turn = config.last_turn.get(trajectory)
    if turn is None:
        return None
    return turn, config.turn_requests[trajectory][turn]
