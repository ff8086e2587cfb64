"""vacuity: a rule that never fired fails the run only when the target ran the rule's scope to the end
("never matched"); when the target stopped first ("not reached") the rule is reported, not failed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bench import RunConfig, RunResult, run
from bench.report import write_report
from bench.report.summary import format_summary
from faults import Plan, plan_from_specs

TRAJECTORIES = [f"g0000{g}-{m}" for g in (0, 1) for m in range(4)]
FIRST, LAST = TRAJECTORIES[0], TRAJECTORIES[-1]


def _run(target: str, plan: Plan, **options) -> RunResult:  # type: ignore[no-untyped-def]
    return asyncio.run(run(RunConfig(trace="rlvr-500", trajectories=TRAJECTORIES, plan=plan, target=target,
                                     isolation="inline", **options)))


def _vacuity(result: RunResult) -> list[str]:
    return [v.message for v in result.violations if v.invariant == "vacuity"]


def test_a_fail_closed_target_leaves_later_rules_not_reached(tmp_path: Path) -> None:
    plan = plan_from_specs([f"http_error:name=first,status=500,trajectories={FIRST}",
                            f"http_error:name=later,status=500,trajectories={LAST}"], seed=1)
    result = _run("tests.discipline_targets:FailsClosed", plan)
    assert result.batch_error is not None and FIRST in result.batch_error.message
    assert [e.rule for e in result.fault_events] == ["first"]
    assert {r.trajectory for r in result.requests} == {FIRST}  # it stopped before anything else
    assert result.violations == []  # fail-fast by policy, with its root cause: nothing else to say
    summary = write_report(result, tmp_path)
    assert summary["vacuity"] == {"not_reached": ["later"], "never_matched": []}
    assert json.loads((tmp_path / "summary.json").read_text())["vacuity"]["not_reached"] == ["later"]
    assert "later: rules the target stopped before" in format_summary(summary)


def test_a_rule_matching_nothing_in_a_finished_run_still_fails(tmp_path: Path) -> None:
    plan = plan_from_specs(["http_error:name=turn-99,status=500,turns=99"], seed=1)
    result = _run("ref-gather:fixed", plan)
    assert result.batch_error is None and {r.outcome for r in result.records} == {"completed"}
    assert _vacuity(result) == ["rule 'turn-99' (http_error) never fired: the target ran its scope to the end "
                                "and the schedule matched nothing"]
    assert write_report(result, tmp_path)["vacuity"] == {"not_reached": [], "never_matched": ["turn-99"]}


def test_a_target_returning_early_did_not_reach_what_it_never_requested() -> None:
    """The target returns after half its trajectories: a rule on one it never requested was not reached;
    a rule on one it ran to the end, matching nothing there, was never matched. A crash keeps the
    second verdict too: the scope was run to its end before the stop."""
    plan = plan_from_specs([f"http_error:name=unrequested,status=500,trajectories={LAST}",
                            f"http_error:name=done-turn-99,status=500,trajectories={FIRST},turns=99"], seed=1)
    result = _run("tests.discipline_targets:StopsHalfway", plan)
    assert result.batch_error is None and result.hang is None
    assert {r.trajectory for r in result.requests} == set(TRAJECTORIES[:4])
    assert _vacuity(result) == ["rule 'done-turn-99' (http_error) never fired: the target ran its scope to the "
                                "end and the schedule matched nothing"]
    crashed = plan_from_specs([f"http_error:name=stop,status=500,trajectories={TRAJECTORIES[1]}",
                               f"http_error:name=done-turn-99,status=500,trajectories={FIRST},turns=99"], seed=1)
    result = _run("tests.discipline_targets:FailsClosed", crashed)
    assert result.batch_error is not None and [e.rule for e in result.fault_events] == ["stop"]
    assert _vacuity(result) == ["rule 'done-turn-99' (http_error) never fired: the target ran its scope to the "
                                "end and the schedule matched nothing"]


def test_a_hang_leaves_unfired_rules_not_reached() -> None:
    """tests:hangs emits half its records and then waits: the rest were never run to their end."""
    plan = plan_from_specs(["http_error:name=anywhere,status=500,turns=99"], seed=1)
    result = _run("tests.targets_for_tests:Hangs", plan, watchdog_s=0.5)
    assert result.hang is not None
    assert _vacuity(result) == []
