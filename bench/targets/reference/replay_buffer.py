"""`ref-replay-buffer`: agent loops feeding a replay buffer, in the shape of verl's agent-loop
rollout and its `ReplayBuffer.sample()` (seed mode 002: verl#6641, fixing #6437).

The pattern. Each GRPO group is one root prompt (`uid`); each of its trajectories is one
agent-loop session. Before dispatching, the manager opens a root marker per group with status
`running` and the number of sessions it expects. Every agent loop then runs a few turns over
HTTP (generate, parse the tool call, append a tool response, generate again) and ends in one of
two ways:

- it succeeded: it writes its sample as a row `(uid, session, index)` with status `success`;
- its request failed (an HTTP error, a dropped connection): it writes no sample, and the root
  marker records the failure with its error (verl's root status `failure`).

When the last session of a group has ended, the root becomes `failure` (some session failed)
or `finished`. The trainer calls `sample()`, which waits until no root is `running`, then
returns the training groups.

- `unfixed`: `sample()` collects the `success` rows and ignores the roots, as verl did before
  the fix. A group whose agent loop failed comes back with members simply missing: the trainer
  computes advantages over a partial group, and nothing says so. The adapter emits exactly the
  samples the trainer received, so the members the framework lost are the ones without a
  record (the runner marks them `lost`, "the target returned no record"), which the
  `group_completeness` invariant reports (and `accounting`, since no outcome came back for them).
- `fixed`: `sample()` fails closed, as the patch does: a root that reached `failure`, or that
  `finished` with fewer successful sessions than expected (counted as unique sessions, not
  rows), is not trained on. Where verl raises for the batch, this reference rejects the group
  loudly and keeps the rest of the batch: the failed session's record is `failed` with its own
  error, each sibling's is `dropped` with an `IncompleteGroup` error naming the group, the failed
  sessions and the missing ones. Every dispatched trajectory still ends in exactly one outcome.

Requests are not retried (a failed turn ends its agent loop). Tool calls are not executed:
the loop answers each one with the output the trace recorded for it (`RecordedTools`, as
ref-tool-loop does), so every turn is the recorded request and the replay stays faithful.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp

from bench.records.sample import ErrorInfo, SampleRecord
from bench.tokenizer import ByteBPETokenizer
from bench.trace.shipped import shipped_trace

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, output_of
from . import ReferenceTarget
from .tool_loop import DEFAULT_TRACE, RecordedTools, parse_tool_calls, tool_message

log = logging.getLogger(__name__)

MAX_TURNS = 2  # turns per agent loop (`job.options["max_turns"]` overrides)
_OUTCOME = {"stop": "completed", "length": "truncated"}

RUNNING, SUCCESS, FAILURE, FINISHED = "running", "success", "failure", "finished"


class AgentLoopError(RuntimeError):
    """An agent loop that cannot go on (the server aborted its generation)."""


class IncompleteGroup(RuntimeError):
    """A group the fixed buffer refuses to train on: sessions that failed, or ended without a sample."""

    def __init__(self, uid: str, expected: int, succeeded: list[str], failed: dict[str, BaseException],
                 missing: list[str]) -> None:
        self.uid, self.expected, self.succeeded, self.failed, self.missing = uid, expected, succeeded, failed, missing
        causes = "; ".join(f"{s}: {type(e).__name__}: {e}" for s, e in sorted(failed.items()))
        super().__init__(f"group {uid} is incomplete, not trained on: {len(succeeded)} of {expected} sessions "
                         f"succeeded; failed: {sorted(failed) or 'none'}; missing: {missing or 'none'}"
                         + (f" ({causes})" if causes else ""))


@dataclass
class Root:
    """The root prompt marker of one group."""

    sessions: list[str]  # expected_rollouts = len(sessions)
    status: str = RUNNING
    open: set[str] = field(default_factory=set)
    failures: dict[str, BaseException] = field(default_factory=dict)


@dataclass
class Batch:
    """What `sample()` hands the trainer: groups to train on, and groups refused (fixed only)."""

    groups: dict[str, list[SampleRecord]]
    rejected: dict[str, IncompleteGroup] = field(default_factory=dict)


class ReplayBuffer:
    """Root markers per group and one `success` row per session output, as verl keys them."""

    def __init__(self, fail_closed: bool) -> None:
        self.fail_closed = fail_closed
        self.roots: dict[str, Root] = {}
        self.rows: dict[tuple[str, str, int], SampleRecord] = {}  # (uid, session_id, index) -> sample
        self._changed = asyncio.Condition()

    def open_group(self, uid: str, sessions: list[str]) -> None:
        self.roots[uid] = Root(list(sessions), open=set(sessions))

    def put(self, uid: str, session: str, index: int, sample: SampleRecord) -> None:
        self.rows[(uid, session, index)] = sample

    async def close_session(self, uid: str, session: str, error: BaseException | None = None) -> None:
        """One agent loop ended; the last one to end turns the root terminal."""
        root = self.roots[uid]
        root.open.discard(session)
        if error is not None:
            root.failures[session] = error
        if not root.open:
            root.status = FAILURE if root.failures else FINISHED
            async with self._changed:
                self._changed.notify_all()

    async def sample(self) -> Batch:
        """Wait until no root is running, then take every group out of the buffer."""
        async with self._changed:
            await self._changed.wait_for(lambda: all(r.status != RUNNING for r in self.roots.values()))
        rows, self.rows = self.rows, {}
        roots, self.roots = self.roots, {}
        by_group: dict[str, list[SampleRecord]] = {}
        for (uid, _session, _index), sample in sorted(rows.items()):
            by_group.setdefault(uid, []).append(sample)
        if not self.fail_closed:
            return Batch(by_group)  # the bug: root statuses (failure, finished-but-short) are never read
        batch = Batch({})
        for uid, root in roots.items():
            present = {session for (group, session, _index) in rows if group == uid}  # unique sessions, not rows
            succeeded = [s for s in root.sessions if s in present]
            missing = [s for s in root.sessions if s not in present and s not in root.failures]
            if root.status == FAILURE or len(succeeded) < len(root.sessions):
                batch.rejected[uid] = IncompleteGroup(uid, len(root.sessions), succeeded, dict(root.failures),
                                                      missing)
            else:
                batch.groups[uid] = by_group.get(uid, [])
        return batch


class RefReplayBuffer(ReferenceTarget):
    family = "ref-replay-buffer"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        buffer = ReplayBuffer(fail_closed=self.fixed)
        groups = job.groups()
        for uid, members in groups.items():
            buffer.open_group(uid, [spec.id for spec in members])
        tokenizer = ByteBPETokenizer.from_folder(job.tokenizer_path)
        tools = await asyncio.to_thread(RecordedTools.load, job.options.get("trace") or shipped_trace(DEFAULT_TRACE),
                                        job.trajectories)
        limit = asyncio.Semaphore(job.concurrency)
        max_turns = int(job.options.get("max_turns", MAX_TURNS))
        async with aiohttp.ClientSession() as http:
            loops = [asyncio.create_task(self._agent_loop(http, limit, job, spec, tokenizer, tools, max_turns,
                                                         buffer))
                     for spec in job.trajectories]
            batch = await buffer.sample()
            await asyncio.gather(*loops)
        for samples in batch.groups.values():  # what the trainer trains on
            for sample in samples:
                emit(sample)
        for uid, refusal in batch.rejected.items():  # fixed only: refused groups, every member accounted for
            log.error("not training on %s", refusal)
            for spec in groups[uid]:
                emit(_refused(spec, refusal))

    async def _agent_loop(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                          spec: TrajectorySpec, tokenizer: ByteBPETokenizer, tools: RecordedTools,
                          max_turns: int, buffer: ReplayBuffer) -> None:
        """One session: a few turns; its sample goes to the buffer, or its failure to the root marker."""
        try:
            sample = await self._turns(http, limit, job, spec, tokenizer, tools, max_turns)
        except Exception as error:  # the agent-loop worker catches it and marks the root
            log.warning("agent loop %s failed: %s: %s", spec.id, type(error).__name__, error)
            await buffer.close_session(spec.group, spec.id, error)
            return
        buffer.put(spec.group, spec.id, 0, sample)
        await buffer.close_session(spec.group, spec.id)

    async def _turns(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                     spec: TrajectorySpec, tokenizer: ByteBPETokenizer, tools: RecordedTools,
                     max_turns: int) -> SampleRecord:
        context = list(spec.prompt_ids)
        response: list[int] = []
        logprobs: list[float] | None = []
        mask: list[int] = []
        versions: list[str] = []
        finish = "stop"
        turns = max(1, min(max_turns, spec.turns))
        for turn in range(turns):
            budget = job.context_length - len(context)
            if budget <= 0:
                finish = "length"
                break
            params = dict(spec.sampling_params)
            params["max_new_tokens"] = min(int(params.get("max_new_tokens") or budget), budget)
            async with limit:
                body = await generate(http, job.base_url, spec, context, params)
            ids, lps, text, finish = output_of(body)
            if finish not in _OUTCOME:
                raise AgentLoopError(f"turn {turn} of {spec.id} ended with finish reason {finish!r}")
            response += ids
            mask += [1] * len(ids)
            logprobs = None if logprobs is None or lps is None else logprobs + lps
            context += ids
            versions.append(str(body["meta_info"].get("weight_version")))
            calls = parse_tool_calls(text)
            if finish != "stop" or not calls or turn + 1 >= turns:
                break
            observation = tokenizer.encode(tool_message([tools.run(spec.id, turn, call) for call in calls]))
            response += observation
            mask += [0] * len(observation)
            logprobs = None if logprobs is None else logprobs + [0.0] * len(observation)
            context += observation
        return SampleRecord(
            trajectory=spec.id, group=spec.group, outcome=_OUTCOME[finish], status=SUCCESS,
            prompt_length=len(spec.prompt_ids), response_ids=response, logprobs=logprobs, loss_mask=mask,
            response_length=len(response), reward=1.0 if finish == "stop" else 0.0, weight_versions=versions)


def _refused(spec: TrajectorySpec, refusal: IncompleteGroup) -> SampleRecord:
    """A member of a refused group: `failed` with its own error, or `dropped` with the group's."""
    own = refusal.failed.get(spec.id)
    if own is not None:
        return SampleRecord(spec.id, spec.group, "failed", status=FAILURE, prompt_length=len(spec.prompt_ids),
                            error=ErrorInfo.of(own))
    outcome = "failed" if spec.id in refusal.missing else "dropped"
    return SampleRecord(spec.id, spec.group, outcome, status="incomplete_group",
                        prompt_length=len(spec.prompt_ids), error=ErrorInfo.of(refusal))
