"""verl 0.8.0's agent-loop rollout (`verl.trainer.main_ppo_sync`) with the bench's bookkeeping around it.

Imported only in the verl environment, in the run (after Ray is up). What runs is verl's: the
`AgentLoopManagerTQ` dispatch (root markers `running` in the `ReplayBuffer`), `AgentLoopWorkerTQ` as Ray
actors (`_run_prompt` gathers a group's sessions and writes the root `finished` or `failure` to
TransferQueue; `_agent_loop_postprocess` writes each session's row `{uid}_{session}_{index}` with status
`success`), verl's `SingleTurnAgentLoop` rendering the prompt with the tokenizer's chat template, its
`LLMServerClient` and `GlobalRequestLoadBalancer`, and `ReplayBuffer.sample()`.

The subclasses add bookkeeping only:
- `BenchAgentLoopWorker._run_agent_loop` runs verl's under the trajectory the session is (the group's
  member at `session_id`), and notes in the `Ledger` actor how it ended (the error it raised, with its
  traceback), then lets verl handle it exactly as before;
- `BenchLLMClient.generate` passes that trajectory to the server handle (`engine.BenchEngine`);
- `BenchManager` makes verl's manager start the bench worker class and marks how many sessions each
  root expects (`expected_rollouts`, a tag the shipped buffer ignores).

`FailClosedReplayBuffer` is the `patched` variant: our own fail-closed `sample()` for the pattern
verl#6641 fixes. A root that ended `failure`, or `finished` with fewer successful sessions (unique
session ids, not rows) than it expected, is not trained on: its keys leave the batch and the refusal is
kept in `rejected`, which the adapter reports member by member.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.trainer.main_ppo_sync import AgentLoopManagerTQ, AgentLoopWorkerTQ, KVBatchMeta, ReplayBuffer, tq
from verl.workers.rollout.llm_server import LLMServerClient

from bench.records.attribution import CURRENT_TRAJECTORY, trajectory_scope
from bench.records.sample import ErrorInfo

from .engine import TRAJECTORY_KEYWORD

log = logging.getLogger(__name__)

MEMBERS_KEY = "bench_members"  # per prompt: the group's trajectory ids, "|"-joined, in session order
LEDGER_NAME = "rollout-bench-ledger"
EXPECTED_KEY = "expected_rollouts"


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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


_SHIPPED_WORKER = AgentLoopWorkerTQ.__ray_actor_class__  # verl's class beneath its `@ray.remote`


class _BenchAgentLoopWorker(AgentLoopWorker):
    """verl's `AgentLoopWorkerTQ`, its methods verbatim (copied below), on a class Ray can ship to its workers.

    Subclassing the class beneath verl's `@ray.remote` does not survive Ray's pickling: that class is not
    importable by name (the module attribute is the actor wrapper), so Ray ships a copy, and the copy's
    zero-argument `super()` in `__init__` then names a different class object. verl's `__init__` is three
    lines and is restated here; every other method is verl's own function object.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        AgentLoopWorker.__init__(self, *args, **kwargs)  # verl 0.8.0's AgentLoopWorkerTQ.__init__, restated
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


for _name, _value in vars(_SHIPPED_WORKER).items():
    if callable(_value) and _name not in ("__init__", "_run_agent_loop"):
        setattr(_BenchAgentLoopWorker, _name, _value)


BenchAgentLoopWorker = ray.remote(_BenchAgentLoopWorker)


class BenchManager(AgentLoopManagerTQ):
    """verl's manager, starting the bench's worker class and noting each root's expected session count."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = BenchAgentLoopWorker

    def generate_sequences(self, prompts: Any) -> None:
        partition_id = "train" if "validate" not in prompts else "val"
        expected = {uid: {EXPECTED_KEY: len(str(members).split("|"))}
                    for uid, members in zip(prompts["uid"], prompts[MEMBERS_KEY], strict=True)}
        self.replay_buffer.add(partition_id, expected)
        super().generate_sequences(prompts)


class FailClosedReplayBuffer(ReplayBuffer):
    """`patched`: `sample()` never returns a partial group; refused roots are kept in `rejected`."""

    def __init__(self, poll_interval: float = 1.0) -> None:
        super().__init__(poll_interval=poll_interval)
        self.rejected: dict[str, str] = {}  # uid -> why it was not trained on

    def sample(self, partition_id: str, global_steps: int | None = None, batch_size: int | None = None) -> Any:
        batch = super().sample(partition_id, global_steps=global_steps, batch_size=batch_size)
        with self.lock:
            roots = {key: dict(tag) for key, tag in self.partitions[partition_id].items()
                     if "_" not in key and tag.get("global_steps") == global_steps}
        sessions: dict[str, set[str]] = defaultdict(set)
        for key in batch.keys:
            uid, session, _index = key.split("_")
            sessions[uid].add(session)
        refused: set[str] = set()
        for uid, tag in roots.items():
            expected = int(tag.get(EXPECTED_KEY, 0))
            succeeded = len(sessions.get(uid, ()))
            if tag["status"] == "failure" or succeeded < expected:
                refused.add(uid)
                self.rejected[uid] = (f"root {uid} ended {tag['status']!r} with {succeeded} of {expected} sessions "
                                      "succeeded: not trained on")
                log.error("replay buffer: %s", self.rejected[uid])
        kept = [(key, tag) for key, tag in zip(batch.keys, batch.tags, strict=True) if key.split("_")[0] not in refused]
        return KVBatchMeta(partition_id=partition_id, keys=[k for k, _ in kept], tags=[t for _, t in kept])


def wait_settled(ledger: Any, expected: set[str], deadline_s: float) -> set[str]:
    """Block until every dispatched session has ended (or the deadline passes); the ones still running."""
    stop = time.monotonic() + deadline_s
    while True:
        _errors, settled = ray.get(ledger.report.remote())
        pending = expected - settled
        if not pending or time.monotonic() > stop:
            return pending
        time.sleep(0.1)
