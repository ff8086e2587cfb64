"""Seed 001 on ref-accumulator: stale async results dropped without replenishing hang; replenished, they don't."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter

import pytest

from bench import Emit, RolloutJob, RunConfig, RunResult, SampleRecord, run
from bench.invariants import Bounds, RunView, staleness
from bench.targets import TargetError, resolve_target
from bench.targets.reference.accumulator import RefAccumulator, result_is_stale
from faults import FaultEvent, resolve_plan

WATCHDOG_S = 1.5
N = 64  # 8 training steps of 8: the stale answers that matter come at steps 2 and later
BATCHES = N // 8


def _config(target: str, **options: object) -> RunConfig:
    return RunConfig(trace="rlvr-500", plan=resolve_plan("seed-001"), target=target, n=N,
                     watchdog_s=WATCHDOG_S, **options)  # type: ignore[arg-type]


def _stale_answers(result: RunResult) -> dict[str, tuple[int, int]]:
    """trajectory -> (server version, reported version) of its stale answer that lags more than one step."""
    out = {}
    for event in result.fault_events:
        assert event.fault == "stale_weight_version"
        current, reported = (int(v) for v in re.fullmatch(r"weight_version (\d+) -> (\d+)", event.change).groups())
        if current - reported > 1:
            out[event.trajectory] = (current, reported)
    return out


def _generate_requests(result: RunResult) -> Counter[str]:
    return Counter(r.trajectory for r in result.requests if r.endpoint == "/generate")


@pytest.fixture(scope="module")
def unfixed() -> tuple[RunResult, set[object]]:
    threads = threading.active_count()

    async def main() -> tuple[RunResult, set[object]]:
        result = await run(_config("ref-accumulator:unfixed"))
        return result, set(asyncio.all_tasks()) - {asyncio.current_task()}

    outcome = asyncio.run(main())
    assert threading.active_count() == threads, "the hung run left a thread behind"
    return outcome


@pytest.fixture(scope="module")
def fixed() -> RunResult:
    return asyncio.run(run(_config("ref-accumulator:fixed")))


def test_variants() -> None:
    assert RefAccumulator("fixed").name == "ref-accumulator:fixed"
    assert resolve_target("ref-accumulator").name == "ref-accumulator:unfixed"
    with pytest.raises(ValueError):
        RefAccumulator("patched")
    with pytest.raises(TargetError):
        resolve_target("ref-accumulator:patched")
    assert result_is_stale("3", 5, 1) and not result_is_stale("4", 5, 1)
    assert not result_is_stale("0", 5, None) and not result_is_stale("default", 5, 1)


def test_unfixed_drains_the_pipeline_and_the_watchdog_reports_the_hang(unfixed: tuple[RunResult, set[object]]) -> None:
    result, leftover = unfixed
    assert leftover == set()  # the watchdog cancelled the workers and the trainer
    assert result.hang is not None and result.hang.idle_s == WATCHDOG_S
    assert result.duration_s > WATCHDOG_S  # it waited out the watchdog (worker start-up is not idle time)
    assert [v.invariant for v in result.violations] == ["liveness"]
    liveness = result.violations[0]
    assert liveness.evidence["pending_tasks"] > 0
    # the trainer is the task that waits: for a batch that can no longer fill
    trainer = [s for s in result.hang.stacks if "target ref-accumulator:unfixed" in s]
    assert len(trainer) == 1 and "self._accumulate(" in trainer[0]
    assert result.batch_error is None
    # the stale answers were dropped for good (never asked for again) ...
    stale = _stale_answers(result)
    dropped = {r.trajectory: r for r in result.records if r.outcome == "dropped"}
    assert stale and set(dropped) == set(stale)
    for trajectory, record in dropped.items():
        assert record.status == "STALE" and record.weight_versions == [str(stale[trajectory][1])]
        assert _generate_requests(result)[trajectory] == 1
    # ... so the trainer waited forever for the last batch: every trained step was full, the rest lost
    outcomes = Counter(r.outcome for r in result.records)
    trained = outcomes["completed"] + outcomes["truncated"]
    assert trained % 8 == 0 and trained < N - len(dropped)
    assert outcomes["lost"] == N - trained - len(dropped) > 0
    assert all(r.error is not None and r.error.type == "Hang" for r in result.records if r.outcome == "lost")
    assert sum(r.endpoint == "/update_weight_version" for r in result.requests) == 1 + trained // 8


def test_fixed_replenishes_the_stale_prompts_and_trains_only_fresh_results(fixed: RunResult) -> None:
    assert fixed.violations == [] and fixed.hang is None and fixed.batch_error is None
    assert {r.outcome for r in fixed.records} <= {"completed", "truncated"} and len(fixed.records) == N
    stale = _stale_answers(fixed)
    assert stale  # the plan did hit answers that lag more than one step
    requests = _generate_requests(fixed)
    for trajectory, (current, reported) in stale.items():
        record = next(r for r in fixed.records if r.trajectory == trajectory)
        assert requests[trajectory] >= 2  # regenerated ...
        assert int(record.weight_versions[0]) >= current  # ... and trained on its fresh answer
    assert sum(requests.values()) == N + sum(1 for e in fixed.fault_events if e.trajectory in stale)
    assert sum(r.endpoint == "/update_weight_version" for r in fixed.requests) == 1 + BATCHES
    versions = Counter(r.weight_versions[0] for r in fixed.records)
    assert max(int(v) for v in versions) == BATCHES - 1  # batches trained at versions 0..7
    assert staleness.check(RunView(fixed.records, fixed.requests, fixed.fault_events, None,
                                   {r.trajectory: r.group for r in fixed.records}, 4096, True,
                                   bounds=Bounds(max_weight_lag=1))) == []


class TrainsOnStale(RefAccumulator):
    """The pre-#1738 accumulator: no staleness check at all (trains on whatever arrives)."""

    def __init__(self) -> None:
        super().__init__("unfixed")
        self.name = "tests:trains-on-stale"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        job.options = {**job.options, "max_result_age": None}
        await super().run(job, emit)


def test_staleness_catches_an_accumulator_that_trains_on_stale_results() -> None:
    result = asyncio.run(run(_config("tests.test_ref_accumulator:TrainsOnStale")))
    assert result.hang is None and result.batch_error is None
    violations = [v for v in result.violations if v.invariant == "staleness"]
    assert {v.invariant for v in result.violations} == {"staleness"}
    stale = _stale_answers(result)
    assert stale and set(stale) <= {v.trajectory for v in violations}
    for v in violations:
        assert v.evidence["lag"] > v.evidence["bound"] == 1
        if v.trajectory in stale:
            assert v.evidence["oldest"] == stale[v.trajectory][1]
            assert v.fault is not None and v.fault["fault"] == "stale_weight_version"


def _record(trajectory: str, version: str, outcome: str = "completed") -> SampleRecord:
    return SampleRecord(trajectory, trajectory.split("-")[0], outcome, weight_versions=[version])


def _view(records: list[SampleRecord], events: list[FaultEvent] = (), lag: int = 1) -> RunView:  # type: ignore[assignment]
    return RunView(records, [], list(events), None, {r.trajectory: r.group for r in records}, 4096, False,
                   bounds=Bounds(max_weight_lag=lag), emitted={r.trajectory: 1 for r in records})


def _event(trajectory: str, current: int, reported: int) -> FaultEvent:
    return FaultEvent("stale-policy", "stale_weight_version", trajectory, trajectory.split("-")[0], 0, 1,
                      "/generate", "rid", 0.0, f"weight_version {current} -> {reported}")


def test_staleness_flags_a_too_old_trained_on_result_and_only_that() -> None:
    steps = [_record(f"g{step}-{i}", str(step)) for step in range(8) for i in range(4)]
    assert staleness.check(_view(steps)) == []  # eight fresh steps: no lag, whatever the newest version
    old = _record("g9-0", "5")
    violations = staleness.check(_view([*steps, old]))  # trained after policy 7 was emitted
    assert [(v.invariant, v.trajectory) for v in violations] == [("staleness", "g9-0")]
    assert violations[0].evidence | {} == {"weight_versions": ["5"], "oldest": 5, "trainer_at_least": 7, "lag": 2,
                                           "bound": 1, "basis": "emission order"}
    assert staleness.check(_view([*steps, old], lag=2)) == []
    assert staleness.check(_view([*steps, _record("g9-0", "6")])) == []
    assert staleness.check(_view([*steps, _record("g9-0", "5", "dropped")])) == []  # dropped, not trained on


def test_staleness_reads_the_server_version_of_a_stale_answer_from_the_fault_log() -> None:
    first = _record("g1-0", "2")  # emitted first in its batch: emission order alone sees no lag
    batch = [first, *(_record(f"g1-{i}", "4") for i in range(1, 4))]
    flagged = staleness.check(_view(batch, [_event("g1-0", 4, 2)]))
    assert [v.trajectory for v in flagged] == ["g1-0"]
    assert flagged[0].evidence["basis"] == "fault log" and flagged[0].evidence["lag"] == 2
    assert flagged[0].fault is not None and flagged[0].fault["change"] == "weight_version 4 -> 2"
    assert staleness.check(_view(batch, [_event("g1-0", 3, 2)])) == []  # one step behind: within the bound
    regenerated = _record("g1-0", "4")  # the stale answer was dropped, the fresh one trained on
    assert staleness.check(_view([regenerated, *batch[1:]], [_event("g1-0", 4, 2)])) == []
