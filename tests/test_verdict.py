"""The verdict on code the bench has never seen (issue 13): the root cause is what raised, with its
traceback everywhere a user looks; a crash on a valid reply fails whatever the fail-fast policy; a
fail-fast target that refuses an injected fault passes. The targets are plug-ins written as a user
writes one from the README (tests/verdict_targets.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from verdict_targets import BAD_TRAJECTORY

from bench import RunConfig, RunResult, run_blocking
from bench.report import load, write_report
from faults import plan_from_specs

ROOT = Path(__file__).resolve().parents[1]
LATENCY_EVERYWHERE = "latency:ms=1,p=1,turns=0"  # a fault event on every trajectory, none altering a reply


def _run(target: str, *specs: str, n: int = 100, **options: object) -> RunResult:
    plan = plan_from_specs(list(specs), 0) if specs else None
    return run_blocking(RunConfig(plan=plan, target=f"tests.verdict_targets:{target}", n=n, **options))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def keyerror() -> RunResult:
    return _run("GatherKeyError", LATENCY_EVERYWHERE)


def test_the_culprit_is_the_trajectory_that_raised_not_the_first_fault_event(keyerror: RunResult) -> None:
    assert keyerror.fault_events[0].trajectory != BAD_TRAJECTORY  # the old verdict's pick
    survival = [v for v in keyerror.violations if v.invariant == "batch_survival"]
    assert [v.trajectory for v in survival] == [BAD_TRAJECTORY]
    assert f"no injected fault reached {BAD_TRAJECTORY}: the target failed on a valid reply" in survival[0].message
    assert survival[0].fault is None  # the latency event it got did not alter its reply: no excuse
    assert keyerror.batch_error is not None and keyerror.batch_error.trajectory == BAD_TRAJECTORY


def test_the_traceback_reaches_summary_table_and_junit(keyerror: RunResult, tmp_path: Path) -> None:
    write_report(keyerror, tmp_path)
    report = load(tmp_path)
    error = report["summary"]["batch_error"]
    assert error["raised_by"] == BAD_TRAJECTORY and error["on_valid_reply"] is True
    assert "Traceback (most recent call last)" in error["traceback"]
    assert 'scores["format_reward"]' in error["traceback"] and "in _score" in error["traceback"]
    rows = report["trajectories"].set_index("trajectory")
    assert 'scores["format_reward"]' in rows.loc[BAD_TRAJECTORY, "error_traceback"]
    assert rows["error_raised_by"].eq(BAD_TRAJECTORY).all()  # every lost row says whose crash lost it
    failure = ET.parse(tmp_path / "junit.xml").getroot().find("testcase[@name='batch_survival']/failure")
    assert failure is not None and 'scores["format_reward"]' in (failure.text or "")


def test_the_terminal_shows_the_failing_line(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "tests.verdict_targets:GatherKeyError",
                           "--n", "100", "--fault", LATENCY_EVERYWHERE, "--time-scale", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          )
    assert done.returncode == 1, done.stderr
    assert f"raised by {BAD_TRAJECTORY}" in done.stdout
    assert 'scores["format_reward"]' in done.stdout and f"{out.resolve()}/summary.json" in done.stdout


def test_a_fail_fast_crash_on_a_valid_reply_is_a_violation() -> None:
    result = _run("FailFastGatherKeyError", LATENCY_EVERYWHERE)
    assert not result.ok
    survival = [v for v in result.violations if v.invariant == "batch_survival"]
    assert [v.trajectory for v in survival] == [BAD_TRAJECTORY]
    assert "fail-fast batch crashed on a valid reply" in survival[0].message


def test_a_fail_fast_target_refusing_an_injected_fault_passes(tmp_path: Path) -> None:
    result = _run("FailClosedOnAbort", "abort:trajectories=g00004-1", n=40, invariants=["batch_survival"])
    assert result.batch_error is not None and result.batch_error.trajectory == "g00004-1"
    assert result.violations == []
    write_report(result, tmp_path)
    error = json.loads((tmp_path / "summary.json").read_text())["batch_error"]
    assert error["fault_reached"]["fault"] == "abort" and "after the injected fault abort" in error["explanation"]
    assert [(r["trajectory"], r["fault"]) for r in error["fail_closed_on"]] == [("g00004-1", "abort")]


def test_a_retried_sample_is_judged_on_the_attempt_it_kept() -> None:
    result = _run("RetriesMissingLogprobs", "missing_logprobs:trajectories=g00001-1,attempts=1", n=8,
                  invariants=["token_alignment"])
    record = next(r for r in result.records if r.trajectory == "g00001-1")
    assert record.attempt == 2 and len(record.request_ids) == 1
    assert [e.fault for e in result.fault_events] == ["missing_logprobs"]  # on the attempt it threw away
    [violation] = result.violations
    assert violation.trajectory == "g00001-1" and violation.fault is None  # not "after missing_logprobs"


def test_a_fault_the_code_never_met_is_not_counted_as_hit(tmp_path: Path) -> None:
    result = _run("OwnToolOnly", "oversized_tool_output:bytes=20000,p=1/4,turns=0", n=40)
    assert result.fault_events and {e.reach for e in result.fault_events} == {"not consumed"}
    write_report(result, tmp_path)
    report = load(tmp_path)
    stats = report["summary"]["drop_rate_by_fault"]["oversized_tool_output"]
    assert stats["trajectories"] == 0 and stats["events_by_reach"] == {"not consumed": len(result.fault_events)}
    assert set(report["faults"]["reach"]) == {"not consumed"}
    assert report["trajectories"]["faults_not_reached"].fillna("").str.contains("oversized_tool_output").sum() \
        == len({e.trajectory for e in result.fault_events})


def test_a_tool_output_the_target_appended_is_consumed() -> None:
    result = run_blocking(RunConfig(plan=plan_from_specs(["oversized_tool_output:bytes=20000,p=1/4,turns=0"], 0),
                                    target="ref-tool-loop:fixed", n=40, isolation="inline"))
    assert result.fault_events and {e.reach for e in result.fault_events} == {"consumed"}


def test_the_repro_reruns_against_the_fix_and_a_top_level_module_plugs_in(tmp_path: Path) -> None:
    """The README's walk-through, step 4: the repro against the fixed target passes; `module:attr` works
    without a package (tests/ is on the path)."""
    out = tmp_path / "report"
    first = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "verdict_targets:GatherKeyError",
                            "--n", "100", "--time-scale", "0", "--out", str(out)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert first.returncode == 1 and (out / "repro.toml").is_file(), first.stderr
    reread = subprocess.run([sys.executable, "-m", "bench", "report", str(out)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    printed = [line for line in first.stdout.splitlines() if line.startswith("repro: ")]
    assert printed and [line for line in reread.stdout.splitlines() if line.startswith("repro: ")] == printed
    artifact = tmp_path / "downloaded" / "report"  # a CI artifact read where it landed: its own repro files
    shutil.copytree(out, artifact)
    moved = subprocess.run([sys.executable, "-m", "bench", "report", "report"], capture_output=True, text=True,
                           timeout=120, cwd=artifact.parent)
    named = [line.split()[1] for line in moved.stdout.splitlines() if line.startswith("repro: ")]
    assert named == [str((artifact / "repro.toml").resolve())], moved.stdout
    fixed = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(out / "repro.toml"),
                            "--target", "verdict_targets:FixedGatherKeyError", "--seed", "7",
                            "--out", str(tmp_path / "fixed")], capture_output=True, text=True, timeout=300,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "target=verdict_targets:FixedGatherKeyError" in fixed.stderr and "seed=7" in fixed.stderr
    summary = json.loads((tmp_path / "fixed" / "summary.json").read_text())
    assert summary["trajectories"] == 1 and summary["violations"] == [] and summary["repros"] == []
    refused = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(out / "repro.toml"),
                              "--n", "5"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "--n and --trace do not apply" in refused.stderr
    assert "or rerun its run.toml" in refused.stderr  # a repro of a part: the whole run's file is the bigger rerun
    whole = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(out / "run.toml"), "--n", "5"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert whole.returncode == 2 and "(edit the file)" in whole.stderr  # already the whole run's: no advice to rerun it
