"""Replay fidelity: a run whose requests left the recording is `unfaithful`; a faithful one is not.

The observed case: real slime retool renders its own prompt, so the server took almost every
request for turn 0 and answered turn 0 again and again, and nothing in the report said so.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, RunResult, run_blocking
from bench.invariants import Bounds, RunView, replay_fidelity
from bench.records.request_log import RequestRecord
from bench.report import format_summary, write_report
from bench.replay import TraceStore
from bench.trace.shipped import resolve_trace
from faults import FaultEvent, plan_from_specs, resolve_plan

OWN_LOOP = "tests.fidelity_targets:OwnLoop"
SEED_004 = ["g00000-0", "g00000-1", "g00000-2", "g00000-3", "g00023-1",  # as in test_ref_tool_loop
            "g00027-0", "g00027-1", "g00027-2", "g00027-3"]


def _run(target: str, trace: str, plan: str | None = None, faults: list[str] | None = None,
         **options: Any) -> RunResult:
    chosen = plan_from_specs(faults, seed=14) if faults else resolve_plan(plan) if plan else None
    return run_blocking(RunConfig(trace=trace, plan=chosen, target=target, isolation="inline", **options))


def _store(result: RunResult) -> TraceStore:
    return TraceStore.load(resolve_trace(str(result.config.trace)), groups_of={r.trajectory for r in result.records})


def _fidelity(result: RunResult) -> list[Any]:
    return [v for v in result.violations if v.invariant == "replay_fidelity"]


def _summary(result: RunResult, folder: Path) -> dict[str, Any]:
    write_report(result, folder)
    return json.loads((folder / "summary.json").read_text())


def test_own_prompt_is_drift_at_turn_0_again_and_again_and_the_run_is_unfaithful(tmp_path: Path) -> None:
    result = _run(OWN_LOOP, "rlvr-500", n=6, target_options={"turns": 3})
    generation = [r for r in result.requests if r.attempt is not None]
    assert len(generation) == 18
    # what the identifier makes of it: turn 0 of the named trajectory, attempt after attempt, each one drift
    assert {(r.turn, r.drift) for r in generation} == {(0, "context")}
    assert sorted(Counter(r.trajectory for r in generation).values()) == [3] * 6
    assert sorted(r.attempt for r in generation if r.trajectory == generation[0].trajectory) == [1, 2, 3]
    [violation] = _fidelity(result)
    assert "unfaithful" in violation.message and "100.0%" in violation.message
    assert "context drift at turn 0 x18" in violation.message
    assert violation.evidence["unfaithful"] is True and violation.evidence["drifted"] == 18
    summary = _summary(result, tmp_path)
    fidelity = summary["fidelity"]
    assert (fidelity["requests"], fidelity["matched"], fidelity["drifted"], fidelity["unknown"]) == (18, 0, 18, 0)
    assert fidelity["share"] == 1.0 and fidelity["unfaithful"] is True
    assert fidelity["top_reasons"] == [{"reason": "context drift at turn 0", "count": 18}]
    assert "replay_fidelity" in summary["violated_invariants"]
    line = next(line for line in format_summary(summary).splitlines() if "replay fidelity" in line)
    assert "UNFAITHFUL" in line and "18 drifted" in line and "context drift at turn 0 x18" in line


def test_own_tool_outputs_drift_after_the_recorded_first_turn() -> None:
    result = _run(OWN_LOOP, "agentic-500", n=4, target_options={"own_prompt": False, "turns": 3})
    fidelity = replay_fidelity.measure(result.requests, result.fault_events)
    assert (fidelity.requests, fidelity.matched, fidelity.drifted) == (12, 4, 8)
    assert fidelity.reasons[0] == ("context drift at turn 1", 8)
    assert len(_fidelity(result)) == 1


def test_unnamed_own_prompts_are_unknown_prompts(tmp_path: Path) -> None:
    result = _run(OWN_LOOP, "rlvr-500", n=4, target_options={"named": False, "turns": 1})
    fidelity = _summary(result, tmp_path)["fidelity"]
    assert (fidelity["requests"], fidelity["matched"], fidelity["unknown"]) == (4, 0, 4)
    assert fidelity["top_reasons"] == [{"reason": "unknown_prompt", "count": 4}]
    [violation] = _fidelity(result)
    assert violation.trajectory is None and "unknown_prompt x4" in violation.message


@pytest.mark.parametrize("target, trace, plan, options", [
    ("ref-gather:fixed", "rlvr-500", "seed-000", {"n": 40}),
    ("ref-tool-loop:fixed", "agentic-500", "seed-004", {"trajectories": SEED_004}),
])
def test_a_faithful_target_has_no_drift(target: str, trace: str, plan: str, options: dict[str, Any],
                                        tmp_path: Path) -> None:
    result = _run(target, trace, plan, bounds=Bounds(max_requests_per_trajectory=100), **options)
    assert _fidelity(result) == []
    fidelity = _summary(result, tmp_path)["fidelity"]
    assert fidelity["requests"] == fidelity["matched"] > 0
    assert fidelity["drifted"] == fidelity["unknown"] == 0 and fidelity["share"] == 0.0
    assert fidelity["unfaithful"] is False
    line = next(line for line in format_summary(_summary(result, tmp_path)).splitlines() if "replay fidelity" in line)
    assert "faithful" in line and "UNFAITHFUL" not in line


def test_drift_a_fault_caused_is_excused() -> None:
    """ref-tool-loop unfixed: replies cut by a fault or without logprobs are continued off the recording."""
    result = _run("ref-tool-loop:unfixed", "agentic-500", "seed-004", trajectories=SEED_004,
                  bounds=Bounds(max_requests_per_trajectory=100))
    fidelity = replay_fidelity.measure(result.requests, result.fault_events)
    assert fidelity.drifted == fidelity.drifted_after_fault > 0
    assert fidelity.share == 0.0 and _fidelity(result) == []


def _request(trajectory: str | None, started: float, drift: str | None, turn: int = 1) -> RequestRecord:
    return RequestRecord(started, "/generate", trajectory=trajectory, turn=turn, attempt=1, drift=drift)


def _view(requests: list[RequestRecord], events: list[FaultEvent], bound: float = 0.05) -> RunView:
    return RunView([], requests, events, None, {}, 4096, False, bounds=Bounds(max_drift_share=bound))


def test_only_drift_after_a_fault_on_the_same_trajectory_is_excused() -> None:
    event = FaultEvent("r", "abort", "a", "g", 0, 1, "/generate", "rid", 10.0, "aborted")
    requests = [_request("a", 9.0, "context"),  # before the fault: counted
                _request("a", 11.0, "context"),  # after it: excused
                _request("b", 11.0, "context"),  # another trajectory: counted
                _request(None, 12.0, "unknown_prompt", turn=0),
                *[_request("c", 1.0 + i, None) for i in range(16)],
                RequestRecord(13.0, "/health")]  # not a generation request
    fidelity = replay_fidelity.measure(requests, [event])
    assert (fidelity.requests, fidelity.matched, fidelity.drifted, fidelity.unknown) == (20, 16, 3, 1)
    assert fidelity.drifted_after_fault == 1 and fidelity.share == pytest.approx(3 / 20)
    assert fidelity.examples == ["a", "b"]
    [violation] = replay_fidelity.check(_view(requests, [event]))
    assert violation.trajectory == "a" and "15.0% off the recording (bound 5%)" in violation.message
    assert replay_fidelity.check(_view(requests, [event], bound=0.15)) == []  # the bound is inclusive
    assert replay_fidelity.check(_view([], [])) == []


def test_a_resumed_abort_is_served_the_rest_of_its_recorded_answer() -> None:
    """A partial rollout resends the prompt plus the aborted answer's tokens, as SGLang clients resume one: that
    is the turn's next attempt, faithful, and it is served the rest of the recorded answer, so the sample ends
    up with exactly the recorded answer (not its start followed by the whole answer again)."""
    result = _run("tests.provenance_targets:keeps_aborted_partial", "rlvr-500", n=24,
                  plan=None, faults=["abort:keep=0.5,p=0.3"])
    aborted = {r.trajectory for r in result.requests if r.finish == "abort"}
    resumed = [r for r in result.requests if r.continues is not None and r.turn == 0]
    assert aborted and {r.trajectory for r in resumed} == aborted
    assert all(r.drift is None and r.attempt >= 2 for r in resumed)  # an abort may hit a resumed attempt too
    assert not _fidelity(result) and not any(r.drift for r in result.requests)
    trajectories = {t.id: t for t in _store(result).trajectories}
    for record in result.records:
        assert tuple(record.response_ids) == trajectories[record.trajectory].turns[0].output_ids, record.trajectory
