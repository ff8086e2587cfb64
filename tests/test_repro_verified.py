"""Repros are claims the bench checked (issue 13): one per failure signature, each rerun and seen failing
the same way before it is written, shrunk to the trajectories and fault events that matter, carrying
every input of the run (client-side rules too), and none at all for a failure that does not come back."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from bench import RunConfig, RunResult, run_blocking
from bench.orchestration.repro import (
    Budget,
    Reproducer,
    Signature,
    candidate_config,
    load_repro,
    write_config,
    write_repros,
)
from faults import Plan, plan_from_specs, resolve_plan

STALE_RETRIED = "g00027-1"  # seed-004 on agentic-500: aborted, then resubmitted with its old tokens (client-side)


def _say(lines: list[str]):  # type: ignore[no-untyped-def]
    return lines.append


@pytest.fixture(scope="module")
def multi_turn() -> RunResult:
    return run_blocking(RunConfig(plan=resolve_plan("seed-004"), target="ref-tool-loop:unfixed", n=120,
                                  isolation="inline", invariants=["token_alignment", "context_budget"]))


def test_one_verified_minimal_repro_per_signature(multi_turn: RunResult, tmp_path: Path) -> None:
    lines: list[str] = []
    outcomes = write_repros(multi_turn, tmp_path, budget=Budget(reruns=6), say=_say(lines))
    assert [o.signature.invariant for o in outcomes] == ["token_alignment", "context_budget"]
    assert [o.path.name for o in outcomes if o.path] == ["repro.toml", "repro-2-context_budget.toml"]
    for outcome in outcomes:
        assert outcome.candidate is not None and len(outcome.candidate.trajectories) == 1  # one of 20-odd culprits
        data = tomllib.loads(outcome.path.read_text())  # type: ignore[union-attr]
        assert data["verified"]["reruns"] >= 1 and data["culprits"] == list(outcome.signature.culprits)
        for key in ("trace", "target", "seed", "concurrency", "time_scale", "watchdog_s", "invariants",
                    "bench_version", "bounds", "trajectories"):
            assert key in data, key
        again = run_blocking(load_repro(outcome.path).config)  # type: ignore[arg-type]
        assert outcome.signature.matches(again.violations)
    assert (tmp_path / "run.toml").is_file() and any("reproduced" in line for line in lines)
    whole = load_repro(tmp_path / "run.toml").config
    assert whole.trajectories == [r.trajectory for r in multi_turn.records] and whole.plan is not None
    assert {r.name for r in whole.plan.rules} == {r.name for r in resolve_plan("seed-004").rules}


def test_a_repro_keeps_client_side_rules(multi_turn: RunResult, tmp_path: Path) -> None:
    signature = Signature("token_alignment", None, (STALE_RETRIED,))
    candidate = Reproducer(multi_turn, signature, Budget(reruns=4), lambda line: None).find()
    assert candidate is not None and candidate.trajectories == [STALE_RETRIED]
    path = write_config(candidate_config(multi_turn, candidate), tmp_path / "repro.toml", result=multi_turn)
    assert 'fault = "stale_retry"' in path.read_text()
    config = load_repro(path).config
    assert signature.matches(run_blocking(config).violations)
    assert config.plan is not None
    server_side_only = Plan("no client rules", config.plan.seed, tuple(r for r in config.plan.rules
                                                                      if r.fault.server_side))
    assert not signature.matches(run_blocking(replace(config, plan=server_side_only)).violations)


def test_a_failure_that_does_not_come_back_gets_no_repro(tmp_path: Path) -> None:
    flaky = tmp_path / "flaky-marker"
    result = run_blocking(RunConfig(plan=plan_from_specs(["latency:ms=1,p=1"], 0),
                                    target="tests.verdict_targets:FailsOnce", n=8,
                                    target_options={"marker": str(flaky)}))
    assert not result.ok
    lines: list[str] = []
    [outcome] = write_repros(result, tmp_path, budget=Budget(reruns=3), say=_say(lines))
    assert outcome.path is None and "not reproduced in 2 reruns" in outcome.note
    assert not (tmp_path / "repro.toml").exists() and (tmp_path / "run.toml").is_file()


def test_a_group_level_finding_keeps_its_whole_group(tmp_path: Path) -> None:
    result = run_blocking(RunConfig(plan=None, target="tests.verdict_targets:DropsOneSilently", n=12,
                                    invariants=["group_completeness"]))
    assert [(v.invariant, v.trajectory) for v in result.violations] == [("group_completeness", "g00001-2")]
    [outcome] = write_repros(result, tmp_path, budget=Budget(reruns=4), say=lambda line: None)
    assert outcome.path is not None and outcome.candidate is not None
    assert outcome.candidate.trajectories == ["g00001-0", "g00001-1", "g00001-2", "g00001-3"]
    again = run_blocking(load_repro(outcome.path).config)
    assert [(v.invariant, v.trajectory) for v in again.violations] == [("group_completeness", "g00001-2")]


def test_a_failure_without_a_culprit_reruns_the_whole_selection(tmp_path: Path) -> None:
    result = run_blocking(RunConfig(plan=None, target="tests.targets_for_tests:Hangs", n=6, watchdog_s=1.0,
                                    invariants=["liveness"]))
    assert [v.trajectory for v in result.violations] == [None]
    [outcome] = write_repros(result, tmp_path, budget=Budget(reruns=2), say=lambda line: None)
    assert outcome.path is not None
    config = load_repro(outcome.path).config
    assert config.trajectories == [r.trajectory for r in result.records] and len(config.trajectories) == 6
    assert [v.invariant for v in run_blocking(config).violations] == ["liveness"]
