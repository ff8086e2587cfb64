"""Real AReaL over many training steps in one worker (`run --steps K`): one engine and workflow executor for the
whole run, AReaL's `prepare_batch` each step, and before each step its trainer's weight sync made by AReaL's remote
engine (`bench/targets/frameworks/areal/session.py`, `weights.py`).

AReaL's syncs name no version, so the server's label stays at step 0's while AReaL's engine counter (the trainer's
version, stamped on every token) moves: the steps' weights are the adapter's, and an update the server applied is
the sync having happened. A crashing reward (`raise_after_generate`, on one trajectory of step 1) drops that episode
(AReaL turns the error into None and takes another sample), the step does not raise and the next one runs as
before. With `max_head_offpolicyness` 1, generation runs ahead into the next step's trajectories.

Needs the areal environment (make targets); each test skips saying so when it is missing.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bench import RunConfig, RunResult, run
from bench.targets.frameworks.envs import target_python
from faults import plan_from_specs

AREAL_PYTHON = target_python("areal")
pytestmark = pytest.mark.skipif(AREAL_PYTHON is None, reason="the areal environment is not built (make targets)")

CRASH = "raise_after_generate:p=1,steps=1,trajectories=g00002-1"  # step 1 holds groups g00002 and g00003 (n=8)
SYNC = ["/pause_generation", "/update_weights_from_distributed", "/continue_generation"]  # AReaL's trainer's order
ADMIN = {"/health", "/init_weights_update_group", *SYNC}


def _run(steps: int, faults: list[str] | None = None, **options: object) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=plan_from_specs(faults, 0) if faults else None, target="areal",
                       n=8, steps=steps, on_step_failure="continue", python=AREAL_PYTHON, watchdog_s=120.0,
                       time_scale=0.05, target_options=dict(options))
    result = asyncio.run(run(config))
    print(f"areal: {Counter((r.step, r.outcome) for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, "
          f"max_lag {[row['max_lag'] for row in (result.steps or {}).get('rows', [])]}")
    return result


def _admin_calls(result: RunResult) -> list[str]:
    return [q.endpoint for q in result.requests if q.endpoint in ADMIN]


def test_four_clean_steps_run_on_one_engine_with_the_trainers_syncs() -> None:
    result = _run(4)
    assert result.violations == [], [v.message for v in result.violations]
    assert result.framework == {"framework": "areal", "version": "1.0.4", "max_weight_lag": "0"}  # AReaL's default
    assert result.config.bounds.max_weight_lag == 0  # synchronous: the bench's default bound 1 narrowed
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None] * 4
    assert [row["n_completed"] + row["n_truncated"] for row in rows] == [8] * 4
    assert [(row["published_by"], row["trainer_version"], row["weight_version"]) for row in rows] == [
        ("adapter", str(step), "0") for step in range(4)]  # the label never moves: no sync names a version
    # one engine for the run (its one health check), the group joined once, a sync before every later step
    assert _admin_calls(result) == ["/health", "/init_weights_update_group"] + SYNC * 3
    # synchronous (max_head_offpolicyness 0, AReaL's default): each step's samples were made by its own version
    assert all(r.weight_versions == [str(r.step)] for r in result.records), \
        [(r.trajectory, r.step, r.weight_versions) for r in result.records if r.weight_versions != [str(r.step)]]


def test_a_crashing_reward_in_step_1_drops_one_episode_and_the_next_step_runs() -> None:
    result = _run(3, [CRASH])
    assert any(e.fault == "raise_after_generate" and e.trajectory == "g00002-1" for e in result.fault_events)
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None] * 3  # AReaL drops the episode; no step raises
    assert [(row["n_completed"] + row["n_truncated"], row["n_failed"]) for row in rows] == [(8, 0), (7, 1), (8, 0)]
    failed = [r for r in result.records if r.outcome == "failed"]
    assert [(r.trajectory, r.error.type if r.error else None) for r in failed] == [("g00002-1", "InjectedFault")]
    assert not [v for v in result.violations if v.invariant.startswith("step_")], \
        [v.message for v in result.violations]
    assert _admin_calls(result) == ["/health", "/init_weights_update_group"] + SYNC * 2


def test_a_held_sync_is_caught_though_the_label_never_moves() -> None:
    """The sync before step 1 is answered and not applied: AReaL's counter says v1, the server kept v0's weights."""
    result = _run(3, ["hold_weights:steps=1"])
    weights = [v for v in result.violations if v.invariant == "step_weights"]
    assert len(weights) == 1 and len(result.violations) == 1, [v.message for v in result.violations]
    evidence = weights[0].evidence
    assert (evidence["step"], evidence["trainer_version"], evidence["server_version"]) == (1, "1", "0")
    assert [u["endpoint"] for u in evidence["ignored_updates"]] == ["/update_weights_from_distributed"]


def test_generation_runs_ahead_into_the_next_step_within_what_the_report_measures() -> None:
    """`max_head_offpolicyness` 1: AReaL starts the next step's trajectories before a step returns, interrupted by
    the sync and sent again under the new version. The lag of what each step trains on is measured from AReaL's
    own counter, and `step_lag` names exactly the steps that trained on a sample more than 1 version behind."""
    result = _run(4, max_head_offpolicyness=1)
    assert result.framework == {"framework": "areal", "version": "1.0.4", "max_weight_lag": "1"}
    step_of = {r.trajectory: r.step for r in result.records}
    synced = [q.started for q in result.requests if q.endpoint == "/continue_generation"]  # steps 1, 2, 3 begin
    ahead = [q for q in result.requests if step_of.get(q.trajectory or "", 0) >= 1
             and q.started < synced[step_of[q.trajectory or ""] - 1]]
    assert ahead, "no request of a step's trajectories before that step began: nothing ran ahead"
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == 32
    assert any(len(r.weight_versions) > 1 for r in result.records)  # interrupted by a sync, resumed under the next
    rows = result.steps["rows"]  # type: ignore[index]
    lagged = {v.evidence["step"] for v in result.violations if v.invariant == "step_lag"}
    assert lagged == {row["step"] for row in rows if (row["max_lag"] or 0) > 1}
    found = {v.invariant for v in result.violations} - {"step_lag", "staleness"}
    assert not found, [v.message for v in result.violations if v.invariant in found]
