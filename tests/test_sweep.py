"""`rollout-bench sweep`: the grid, what a rate does to a plan, the table, and runs that crash or hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from bench.cli import main
from bench.report import load
from bench.report.intervals import wilson
from bench.sweep.grid import SweepError, at_rate, build_grid, parse_rates
from bench.sweep.table import Finished, outcome_of
from faults import resolve_plan, shipped_plans
from faults.plan import parse_plan, plan_to_toml

ROOT = Path(__file__).resolve().parent.parent


def sweep(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`rollout-bench sweep ...` as a user runs it, from the repository root (so `tests.` targets import)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "bench", "sweep", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# --- what a rate does to a plan ---------------------------------------------------------------------------

def test_rate_sets_a_single_rule_plan_p_and_replaces_the_seed() -> None:
    [point] = build_grid([resolve_plan("seed-000")], ["ref-gather:fixed"], [Fraction(1, 100)], [11])
    [rule] = point.plan.rules
    assert rule.schedule.p == Fraction(1, 100) and rule.schedule.turns == frozenset({0})
    assert point.plan.seed == 11 and point.plan.name == "seed-000"


def test_rate_rescales_a_mixed_plan_keeping_ratios_and_leaves_rules_without_p_alone() -> None:
    chaos = resolve_plan("chaos")
    scaled = at_rate(chaos, Fraction(1, 10))
    assert max(r.schedule.p for r in scaled.rules if r.schedule.p is not None) == Fraction(1, 10)
    highest = max(r.schedule.p for r in chaos.rules if r.schedule.p is not None)
    fixed_rules = 0
    for before, after in zip(chaos.rules, scaled.rules, strict=True):
        if before.schedule.p is None:
            assert after == before
            fixed_rules += 1
        else:
            assert after.schedule.p / Fraction(1, 10) == before.schedule.p / highest
    assert fixed_rules >= 1  # chaos has rules without `p` (e.g. abort_all_on_weight_update): the test means it
    zero = at_rate(chaos, Fraction(0))
    assert len(zero.rules) == fixed_rules and all(r.schedule.p is None for r in zero.rules)


@pytest.mark.parametrize("name", sorted(shipped_plans()))
def test_swept_plans_round_trip_through_plan_files(name: str) -> None:
    plan = resolve_plan(name)
    for rate in (Fraction(0), Fraction(1, 400), Fraction(3, 10), Fraction(1)):
        swept = at_rate(plan, rate).with_seed(5)
        back = parse_plan(plan_to_toml(swept), f"<{name} at {rate}>")
        assert [r.describe() for r in back.rules] == [r.describe() for r in swept.rules]
        assert (back.name, back.seed) == (plan.name, 5)


def test_rates_parse_exactly() -> None:
    assert parse_rates("0.01, 1/400,0,1") == [Fraction(1, 100), Fraction(1, 400), Fraction(0), Fraction(1)]
    with pytest.raises(SweepError, match="--rates"):
        parse_rates("0.01,")


@pytest.mark.parametrize("args, message", [
    (["--plan", "no-such-plan"], "--plan: plan 'no-such-plan'"),
    (["--rates", "0.01,abc"], "--rates '0.01,abc': 'abc' is not a number"),
    (["--rates", "0.5,1.5"], "--rates '0.5,1.5': rate 1.5 is outside [0, 1]"),
    (["--rates", "-0.1"], "rate -0.1 is outside [0, 1]"),
    (["--seeds", "1,x"], "--seeds '1,x': 'x' is not an integer"),
    (["--target", "ref-gather:fixed,nope"], "--target: unknown target 'nope'"),
    (["--trace", "no-such-trace"], "--trace: trace 'no-such-trace'"),
    (["--jobs", "0"], "--jobs 0"),
    (["--timeout", "0"], "--timeout 0"),
    (["--invariants", "liveness,nope"], "--invariants 'liveness,nope': unknown or none (nope)"),
])
def test_bad_options_fail_before_any_run_naming_the_option(args: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    options = {"--plan": "seed-000", "--target": "ref-gather:fixed", "--rates": "0.01", "--seeds": "1",
               "--out": str(tmp_path / "out")}
    options.update(dict(zip(args[::2], args[1::2])))
    code = main(["sweep", *[item for pair in options.items() for item in pair]])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_plan_without_probability_rules_cannot_be_swept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "every.toml"
    plan.write_text('name = "every"\n[[rules]]\nfault = "abort"\nevery = 10\n', encoding="utf-8")
    code = main(["sweep", "--plan", str(plan), "--target", "ref-gather:fixed", "--rates", "0.1", "--seeds", "1",
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "no rule has a probability" in capsys.readouterr().err


def test_out_must_be_new_or_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.txt").write_text("an older sweep", encoding="utf-8")
    code = main(["sweep", "--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.01", "--seeds", "1",
                 "--out", str(tmp_path)])
    assert code == 2 and "--out" in capsys.readouterr().err


def test_outcome_of_a_run() -> None:
    summary = {"violations": []}
    assert outcome_of(Finished(0, False, 1.0, ""), summary) == "ok"
    assert outcome_of(Finished(1, False, 1.0, ""), {"violations": [{"invariant": "liveness"}]}) == "violations"
    assert outcome_of(Finished(0, False, 1.0, ""), None) == "crashed"  # exit 0 but no report
    assert outcome_of(Finished(2, False, 1.0, ""), summary) == "crashed"  # a stale summary does not count
    assert outcome_of(Finished(-9, False, 1.0, ""), None) == "crashed"
    assert outcome_of(Finished(None, True, 9.0, ""), summary) == "timeout"


def test_wilson_interval_known_values() -> None:
    low, high = wilson([0, 5, 10, 1], [10, 10, 10, 500])
    assert low[0] == 0.0 and high[0] == pytest.approx(0.27753, abs=1e-5)
    assert (low[1], high[1]) == (pytest.approx(0.23659, abs=1e-5), pytest.approx(0.76341, abs=1e-5))
    assert low[2] == pytest.approx(0.72247, abs=1e-5) and high[2] == 1.0
    assert 0 < low[3] < 1 / 500 < high[3] < 0.012
    with pytest.raises(ValueError):
        wilson([3], [2])


# --- whole sweeps ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sweep_of_four_rates_by_three_seeds_over_the_500_trajectory_trace(tmp_path: Path) -> None:
    """The issue's bar: 4 rates x 3 seeds over agentic-500, on 2 cores, one row per run."""
    out = tmp_path / "sweep"
    rates, seeds = ["0.005", "0.01", "0.02", "0.05"], [1, 2, 3]
    clock = time.monotonic()
    done = sweep("--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", ",".join(rates), "--seeds",
                 ",".join(map(str, seeds)), "--time-scale", "0", "--jobs", "2", "--out", str(out))
    elapsed = time.monotonic() - clock
    print(f"sweep of 12 runs x 500 trajectories on 2 jobs: {elapsed:.1f} s")  # measured, not asserted
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 12
    assert sorted(zip(table["rate"], table["seed"])) == sorted((float(r), s) for r in rates for s in seeds)
    assert set(table["outcome"]) == {"ok"} and set(table["exit_code"]) == {0}
    assert set(table["trajectories"]) == {500} and set(table["target"]) == {"ref-gather:fixed"}
    # the fixed variant aborts exactly the trajectories the fault poisoned: the counts must agree
    assert (table["dropped"] == table["fault_events"]).all() and (table["dropped"] == table["n_aborted"]).all()
    assert (table["drop_rate"] * 500 == table["dropped"]).all()
    events = table.groupby("rate")["fault_events"].sum()
    assert events[0.05] > events[0.005]  # fault decisions are fixed by the seeds: this cannot flake
    for row in table.itertuples():
        summary = json.loads((out / row.report / "summary.json").read_text())
        assert summary["seed"] == row.seed  # the grid's seed replaced the plan's (2)
        [rule] = parse_plan((out / row.report / "plan.toml").read_text(), "plan.toml").rules
        assert rule.schedule.p == Fraction(str(row.rate))
        assert f"{row.run}: ok" in done.stderr and f"seed {row.seed}" in done.stderr
    loaded = load(out)
    assert len(loaded["runs"]) == 12 and loaded["summary"]["status"] == "finished"
    assert loaded["summary"]["outcomes"] == {"ok": 12, "violations": 0, "no_requests": 0, "interrupted": 0, "crashed": 0,
                                                "timeout": 0, "lost": 0}
    one = load(loaded["runs"]["report"].iloc[-1])
    assert len(one["trajectories"]) == 500 and one["summary"]["seed"] == 3
    assert set(loaded["faults"]["fault"]) == {"raise_after_generate"}
    listed = subprocess.run([sys.executable, "-m", "bench", "report", str(out)], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert len([line for line in listed.stdout.splitlines() if "seed-000 ref-gather:fixed" in line]) == 12


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            found.append(f"{entry.name}: {command}")
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to check nothing is left running")
def test_a_run_that_crashes_or_hangs_is_a_row_not_a_lost_sweep(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    targets = ["tests.targets_for_tests:KillsTheRun", "tests.targets_for_tests:FreezesTheRun",
               "tests.targets_for_tests:Hangs", "ref-gather:fixed"]
    done = sweep("--plan", "seed-000", "--target", ",".join(targets), "--rates", "0.02", "--seeds", "4",
                 "--n", "20", "--time-scale", "0", "--watchdog", "8", "--timeout", "30", "--jobs", "4",
                 "--out", str(out))
    assert done.returncode == 1, done.stderr[-3000:]  # not every run was ok
    table = load(out)["runs"].set_index("target")
    assert len(table) == 4
    killed, frozen = table.loc[targets[0]], table.loc[targets[1]]
    assert killed["outcome"] == "crashed" and killed["exit_code"] == -9 and pd.isna(killed["drop_rate"])
    assert killed["error"].startswith("killed by SIGKILL; last output: ")
    assert frozen["outcome"] == "timeout" and pd.isna(frozen["exit_code"])
    assert frozen["error"] == "killed by the sweep's timeout"
    hung = table.loc[targets[2]]  # the run's own watchdog caught this one: a report with the violation
    assert hung["outcome"] == "violations" and hung["hang"] and "liveness" in hung["violated_invariants"]
    assert table.loc[targets[3], "outcome"] == "ok"
    assert (Path(killed["report"]) / "run.log").exists() and not (Path(killed["report"]) / "summary.json").exists()
    assert "timeout" in done.stderr and "crashed" in done.stderr
    assert _processes_mentioning(str(out)) == []  # the frozen run was killed, nothing it started survives
