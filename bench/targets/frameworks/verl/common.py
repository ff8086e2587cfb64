"""The bench's bookkeeping around verl's agent-loop workers, shared by the verl versions the adapter drives.

Imported only in the verl environment, in the run (after Ray is up). verl's own code does the work; what
is added here is bookkeeping only:
- `SessionBookkeeping._run_agent_loop` runs verl's under the trajectory the session is (the group's member
  at `session_id`) and notes in the `Ledger` actor how it ended (the error it raised, with its
  traceback), then lets verl handle it exactly as before;
- `BenchLLMClient.generate` passes that trajectory to the server handle (`engine.BenchEngine`);
- `SessionBookkeeping._compute_score`, where verl scores each session before writing its row, fails a session
  whose reply carries the `raise_after_generate` poison, as a reward function that cannot parse it would.

verl's worker class sits beneath a `@ray.remote` and cannot be subclassed as such: that class is not
importable by name (the module attribute is Ray's wrapper), so Ray ships a copy of it, and the copy's
zero-argument `super()` in `__init__` then names a different class object (`TypeError: super(type, obj)`).
The bench's worker classes therefore derive from verl's plain `AgentLoopWorker`, restate its three-line
`__init__` (`SessionBookkeeping.__init__`) and take every other method of verl's class as the very function
objects verl defines (`adopt_methods`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.workers.rollout.llm_server import LLMServerClient

from bench.records.attribution import CURRENT_TRAJECTORY, trajectory_scope
from bench.records.sample import ErrorInfo
from faults.hooks import raise_if_poisoned

from .engine import TRAJECTORY_KEYWORD

log = logging.getLogger(__name__)

MEMBERS_KEY = "bench_members"  # per prompt: the group's trajectory ids, "|"-joined, in session order
LEDGER_NAME = "rollout-bench-ledger"
EXPECTED_KEY = "expected_rollouts"  # a root's session count, a tag verl's own buffers ignore
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Ledger:
    """How each session ended, as the agent-loop workers saw it (a Ray actor, made remote in the run)."""

    def __init__(self) -> None:
        self.errors: dict[str, ErrorInfo] = {}
        self.settled: set[str] = set()

    def note(self, trajectory: str, error: ErrorInfo | None) -> None:
        if error is not None:
            self.errors[trajectory] = error
        self.settled.add(trajectory)

    def report(self) -> tuple[dict[str, ErrorInfo], set[str]]:
        return dict(self.errors), set(self.settled)


def error_info(error: BaseException, trajectory: str) -> ErrorInfo:
    """The error a session ended with. A `RayTaskError` is named by what it carries (the server actor's own
    exception, e.g. the HTTP 500), and Ray's terminal colours are taken out of its text."""
    info = ErrorInfo.of(error)
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        return ErrorInfo(type(cause).__name__, f"{cause} (raised in a Ray actor; verl saw {type(error).__name__})",
                         _ANSI.sub("", info.traceback), trajectory)
    return ErrorInfo(info.type, _ANSI.sub("", info.message), _ANSI.sub("", info.traceback), trajectory)


def session_trajectory(kwargs: dict[str, Any]) -> str:
    """The trajectory a session is: the group's member at `session_id`."""
    return str(kwargs[MEMBERS_KEY]).split("|")[int(kwargs["session_id"])]


class BenchLLMClient(LLMServerClient):
    """verl's client; the trajectory the calling agent loop works for goes to the server handle."""

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        trajectory = CURRENT_TRAJECTORY.get()
        if trajectory is not None:
            kwargs[TRAJECTORY_KEYWORD] = trajectory
        return await super().generate(request_id, **kwargs)


class SessionBookkeeping(AgentLoopWorker):
    """verl's `AgentLoopWorkerTQ.__init__` (the same in 0.8.0 and 0.9.1) and the per-session bookkeeping."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import transfer_queue as tq

        AgentLoopWorker.__init__(self, *args, **kwargs)
        tq.init()
        self.background_tasks = set()

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *,
                              agent_name: str, trace: bool = True, **kwargs: Any) -> Any:
        session = session_trajectory(kwargs)
        ledger = ray.get_actor(LEDGER_NAME)
        with trajectory_scope(session):
            try:
                result = await AgentLoopWorker._run_agent_loop(self, sampling_params, trajectory,
                                                               agent_name=agent_name, trace=trace, **kwargs)
            except BaseException as error:
                await ledger.note.remote(session, error_info(error, session))
                raise
        await ledger.note.remote(session, None)
        return result

    async def _compute_score(self, outputs: list[Any], kwargs: dict[str, Any]) -> None:
        """verl's scoring step (`AgentLoopWorker._compute_score`, awaited by the TQ worker's
        `_agent_loop_postprocess` before the session's row is written). The run has no reward-loop workers, so
        verl scores nothing here; the bench stands in for the user's reward function (`reward.custom_reward_function`,
        which verl's `RewardLoopWorker` runs from this call) only to raise on a poisoned reply: the session fails
        and writes no row, as when that function raises."""
        raise_if_poisoned(self.tokenizer.decode(outputs[-1].response_ids, skip_special_tokens=True))
        await AgentLoopWorker._compute_score(self, outputs, kwargs=kwargs)


def adopt_methods(bench_class: type, shipped_actor_class: Any) -> Any:
    """Give `bench_class` every method of verl's worker class but those restated here; its Ray actor class."""
    shipped = shipped_actor_class.__ray_actor_class__
    for name, value in vars(shipped).items():
        if callable(value) and name not in ("__init__", "_run_agent_loop", "_compute_score"):
            setattr(bench_class, name, value)
    return ray.remote(bench_class)


def wait_settled(ledger: Any, expected: set[str], deadline_s: float) -> set[str]:
    """Block until every dispatched session has ended (or the deadline passes); the ones still running."""
    stop = time.monotonic() + deadline_s
    while True:
        _errors, settled = ray.get(ledger.report.remote())
        pending = expected - settled
        if not pending or time.monotonic() > stop:
            return pending
        time.sleep(0.1)


class StartsBenchWorkers:
    """Mixin for verl's `AgentLoopManagerTQ`: its workers are `bench_workers` (set by each version's module)."""

    bench_workers: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = self.bench_workers


def complete_groups(keys: list[str], tags: list[dict], roots: dict[str, tuple[str, int]],
                    rejected: dict[str, str]) -> tuple[list[str], list[dict]]:
    """The fail-closed rule of `patched`: the rows of the groups that may be trained on.

    `roots` maps each root of the batch to its terminal status and the sessions it expected. A root that
    ended `failure`, or with fewer successful sessions (unique session ids among its rows, not rows) than
    expected, is refused: noted in `rejected` (uid -> why) and logged, its rows left out.
    """
    sessions: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        uid, session, _index = key.split("_")
        sessions[uid].add(session)
    for uid, (status, expected) in roots.items():
        succeeded = len(sessions.get(uid, ()))
        if status == "failure" or succeeded < expected:
            rejected[uid] = (f"root {uid} ended {status!r} with {succeeded} of {expected} sessions succeeded: "
                             "not trained on")
            log.error("replay buffer: %s", rejected[uid])
    kept = [(key, tag) for key, tag in zip(keys, tags, strict=True) if key.split("_")[0] not in rejected]
    return [key for key, _ in kept], [tag for _, tag in kept]
