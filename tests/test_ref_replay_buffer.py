"""Seed 002 (verl#6641, #6437) on ref-replay-buffer: partial groups after failed agent loops.

seed-002 answers 1 in 40 turns with HTTP 500 and resets 1 in 80 connections. On the first 60
trajectories of agentic-500 (15 groups of 4, two turns each) that hits four agent loops in four
groups, both rules among them.
"""

from __future__ import annotations

import asyncio

import pytest

from bench import ErrorInfo, RunConfig, RunResult, SampleRecord, run
from bench.invariants import RunView, check_all, group_completeness
from bench.targets import resolve_target
from bench.targets.reference.replay_buffer import Batch, IncompleteGroup, RefReplayBuffer, ReplayBuffer
from faults import FaultEvent, resolve_plan
from tests.seed_002_helpers import SEED_002_FAULTS, assert_partial_groups_named, faulted_groups

N = 60
PLAN_FAULTS = SEED_002_FAULTS


def _run(variant: str) -> RunResult:
    config = RunConfig(trace="agentic-500", plan=resolve_plan("seed-002"), target=f"ref-replay-buffer:{variant}", n=N)
    return asyncio.run(run(config))


@pytest.fixture(scope="module")
def unfixed() -> RunResult:
    return _run("unfixed")


@pytest.fixture(scope="module")
def fixed() -> RunResult:
    return _run("fixed")


def test_seed_002_hits_a_few_groups_with_both_rules(unfixed: RunResult, fixed: RunResult) -> None:
    for result in (unfixed, fixed):
        assert {e.fault for e in result.fault_events} == PLAN_FAULTS
        assert 2 <= len(faulted_groups(result)) < N // 4
        assert result.batch_error is None and result.hang is None
        assert {r.turn for r in result.requests} == {0, 1}  # agent loops of two turns
    assert faulted_groups(unfixed) == faulted_groups(fixed)


def test_unfixed_buffer_trains_on_silently_partial_groups(unfixed: RunResult) -> None:
    assert_partial_groups_named(unfixed)
    partial = [v for v in unfixed.violations if v.invariant == "group_completeness"]
    assert {v.fault["fault"] for v in partial if v.fault} == PLAN_FAULTS
    # the members the buffer silently lost: no record from the target, so the runner marks them lost
    missing = {t for v in partial for t in v.evidence["missing"]}
    lost = {r.trajectory for r in unfixed.records if r.outcome == "lost"}
    assert lost == missing
    assert all(r.error is not None and r.error.message == "the target returned no record"
               for r in unfixed.records if r.outcome == "lost")
    assert {v.trajectory for v in unfixed.violations if v.invariant == "accounting"} == missing
    assert {v.invariant for v in unfixed.violations} == {"group_completeness", "accounting"}
    assert sum(r.outcome == "completed" for r in unfixed.records) == N - len(missing)


def test_fixed_buffer_fails_closed_and_reports_every_member(fixed: RunResult) -> None:
    assert fixed.violations == []
    faulted = faulted_groups(fixed)
    by_id = {r.trajectory: r for r in fixed.records}
    assert len(by_id) == len(fixed.records) == N
    for group, hit in faulted.items():
        members = [r for r in fixed.records if r.group == group]
        assert len(members) == 4
        for record in members:
            assert record.error is not None
            if record.trajectory in hit:
                assert record.outcome == "failed"
                assert record.error.type in ("ClientResponseError", "ServerDisconnectedError", "ClientOSError")
            else:
                assert record.outcome == "dropped" and record.error.type == "IncompleteGroup"
                assert f"group {group} is incomplete" in record.error.message
                assert all(t in record.error.message for t in hit)
    untouched = [r for r in fixed.records if r.group not in faulted]
    assert untouched and all(r.outcome == "completed" and r.error is None for r in untouched)
    assert all(0 in r.loss_mask and 1 in r.loss_mask for r in untouched)  # tool response masked out


def test_variants() -> None:
    assert resolve_target("ref-replay-buffer:fixed").name == "ref-replay-buffer:fixed"
    assert RefReplayBuffer().name == "ref-replay-buffer:unfixed"
    with pytest.raises(ValueError):
        RefReplayBuffer("patched")


def _sample(session: str, uid: str = "g0") -> SampleRecord:
    return SampleRecord(session, uid, "completed", response_ids=[1], loss_mask=[1], response_length=1)


async def _fill(buffer: ReplayBuffer) -> None:
    """g0: s0 succeeds with two rows, s1 ends without a sample and without an error; g1: s2, s3 succeed."""
    buffer.open_group("g0", ["s0", "s1"])
    buffer.open_group("g1", ["s2", "s3"])
    buffer.put("g0", "s0", 0, _sample("s0"))
    buffer.put("g0", "s0", 1, _sample("s0"))  # one session, two output rows: still one session
    await buffer.close_session("g0", "s0")
    await buffer.close_session("g0", "s1")
    for session in ("s2", "s3"):
        buffer.put("g1", session, 0, _sample(session, "g1"))
        await buffer.close_session("g1", session)


def test_buffer_finished_root_with_a_missing_session() -> None:
    async def main() -> tuple[Batch, Batch]:
        unfixed, fixed = ReplayBuffer(fail_closed=False), ReplayBuffer(fail_closed=True)
        await _fill(unfixed)
        await _fill(fixed)
        return await unfixed.sample(), await fixed.sample()

    partial, closed = asyncio.run(main())
    assert sorted(partial.groups) == ["g0", "g1"] and not partial.rejected  # the bug: g0 trained on s0 alone
    assert sorted(closed.groups) == ["g1"] and sorted(closed.rejected) == ["g0"]
    refusal = closed.rejected["g0"]
    assert isinstance(refusal, IncompleteGroup)
    assert refusal.missing == ["s1"] and refusal.succeeded == ["s0"] and refusal.failed == {}


def test_buffer_sample_waits_for_running_roots() -> None:
    async def main() -> list[str]:
        buffer = ReplayBuffer(fail_closed=True)
        buffer.open_group("g0", ["s0"])
        sampling = asyncio.create_task(buffer.sample())
        await asyncio.sleep(0.05)
        assert not sampling.done()
        buffer.put("g0", "s0", 0, _sample("s0"))
        await buffer.close_session("g0", "s0")
        batch = await asyncio.wait_for(sampling, 1)
        return sorted(batch.groups)

    assert asyncio.run(main()) == ["g0"]


def _view(records: list[SampleRecord], emitted: dict[str, int], events: list[FaultEvent] | None = None,
          batch_error: ErrorInfo | None = None) -> RunView:
    dispatched = {f"g{g}-{m}": f"g{g}" for g in range(2) for m in range(4)}
    return RunView(records, [], events or [], None, dispatched, 4096, False, batch_error=batch_error,
                   emitted=emitted)


def _event(trajectory: str) -> FaultEvent:
    return FaultEvent("server-error", "http_error", trajectory, trajectory.split("-")[0], 1, 1, "/generate", "r1",
                      0.0, "answered HTTP 500")


def _completed(trajectory: str) -> SampleRecord:
    return SampleRecord(trajectory, trajectory.split("-")[0], "completed")


def _missing(trajectory: str) -> SampleRecord:
    return SampleRecord(trajectory, trajectory.split("-")[0], "lost",
                        error=ErrorInfo("Missing", "the target returned no record", ""))


def test_group_completeness_catches_a_partial_group_and_accepts_complete_ones() -> None:
    every = [f"g{g}-{m}" for g in range(2) for m in range(4)]
    complete = [_completed(t) for t in every]
    assert group_completeness.check(_view(complete, dict.fromkeys(every, 1))) == []

    records = [_missing(t) if t == "g1-2" else _completed(t) for t in every]
    emitted = {t: 1 for t in every if t != "g1-2"}
    violations = group_completeness.check(_view(records, emitted, [_event("g0-0"), _event("g1-2")]))
    assert len(violations) == 1
    violation = violations[0]
    assert violation.invariant == "group_completeness" and violation.trajectory == "g1-2"
    assert violation.evidence["group"] == "g1" and violation.evidence["missing"] == ["g1-2"]
    assert violation.evidence["kept"] == ["g1-0", "g1-1", "g1-3"]
    assert violation.evidence["missing_faults"] == {"g1-2": ["http_error"]}
    assert violation.fault is not None and violation.fault["trajectory"] == "g1-2"

    # no record at all (a hand-built view without the runner's fill-in): also silent
    violations = group_completeness.check(_view([r for r in records if r.trajectory != "g1-2"], {}))
    assert [(v.evidence["group"], v.evidence["missing"], v.fault) for v in violations] == [("g1", ["g1-2"], None)]


def test_group_completeness_accepts_loud_failures_and_leaves_crashes_to_batch_survival() -> None:
    every = [f"g{g}-{m}" for g in range(2) for m in range(4)]
    loud = [SampleRecord(t, t.split("-")[0], "failed" if t == "g1-2" else "dropped" if t.startswith("g1") else
                         "completed", error=ErrorInfo("IncompleteGroup", "group g1 is incomplete", ""))
            for t in every]
    assert check_all(_view(loud, dict.fromkeys(every, 1)), ["group_completeness", "accounting"]) == []

    crashed = [_missing(t) if t.startswith("g1-2") else _completed(t) for t in every]
    error = ErrorInfo("InjectedFault", "boom", "")
    assert group_completeness.check(_view(crashed, {t: 1 for t in every if t != "g1-2"}, batch_error=error)) == []
