"""`run --steps K`: the rollout called K times in one worker process, weights published between steps, and the
checks across steps (bench/steps/). Each check is shown catching a reference target's bug (`unfixed`) and passing
its fix (`fixed`) at K = 5, in a worker process: the resources measured are the target's, not the bench's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import xml.etree.ElementTree as ET

from bench import RunConfig, RunResult
from bench.orchestration.runner import run_blocking
from bench.steps.checks import MIN_STEPS_FOR_GROWTH
from bench.report import load
from bench.report.junit import write_junit
from bench.steps.run import StepsError
from faults import plan_from_specs

K, N = 5, 4  # 5 steps of one group of 4 (agentic-500's groups are 4)
TRACE = "agentic-500"


def _run(target: str, *faults: str, steps: int = K, n: int = N, **options: object) -> RunResult:
    options = {"watchdog_s": 20.0, **options}
    return run_blocking(RunConfig(trace=TRACE, plan=plan_from_specs(list(faults), 0), target=target, n=n,
                                  steps=steps, warm=False, **options))  # type: ignore[arg-type]


def _names(result: RunResult) -> list[str]:
    return sorted(v.invariant for v in result.violations)


LEAKS = {"tasks": "tasks", "threads": "threads", "sockets": "sockets", "children": "children", "memory": "rss_bytes"}


@pytest.mark.parametrize("leak", list(LEAKS))
def test_a_leak_per_step_is_caught_and_its_fix_passes(leak: str) -> None:
    unfixed = _run("ref-step-leak:unfixed", target_options={"leak": leak})
    growth = {v.evidence["resource"]: v for v in unfixed.violations if v.invariant == "step_resources"}
    # a leaked task is alive: under load its over-sampling call may hold a connection open at each step's end too
    also = {"sockets", "fds"} if leak == "tasks" else set()
    assert LEAKS[leak] in growth and set(growth) - {LEAKS[leak]} <= also, unfixed.violations
    evidence = growth[LEAKS[leak]].evidence
    assert list(evidence["per_step"]) == [str(step) for step in range(K)]  # evidence for every step
    assert evidence["first_step"] >= 1
    assert unfixed.steps is not None and unfixed.steps["first_violation"]["invariant"] in ("step_resources",
                                                                                          "step_late_requests")
    if leak in ("tasks", "threads", "children", "sockets"):  # what grew is named: each step's leftover
        assert len(evidence["new"]) == K - 1, evidence
    fixed = _run("ref-step-leak:fixed", target_options={"leak": leak})
    assert fixed.violations == [], [v.message for v in fixed.violations]
    assert [row["samples"] for row in fixed.steps["rows"]] == [N] * K  # type: ignore[index]


def test_an_orphaned_task_calling_the_server_after_its_step_is_caught() -> None:
    # replayed at 1/20 of the recorded speed (as the command line does): each step lasts long enough (~0.1 s and
    # more) for an over-sampling task left by an earlier step to call the server during it
    unfixed = _run("ref-step-leak:unfixed", target_options={"leak": "tasks"}, time_scale=0.05)
    late = [v for v in unfixed.violations if v.invariant == "step_late_requests"]
    assert late, _names(unfixed)
    for violation in late:
        step = violation.evidence["step"]
        assert all(during > step for during in violation.evidence["during_steps"])
        first = violation.evidence["first"][0]
        assert first["trajectory"] == violation.trajectory and first["after_return_s"] > 0
    # the fixed variant's over-sampling task ends with its step: nothing arrives for a step that returned
    fixed = _run("ref-step-leak:fixed", target_options={"leak": "tasks"}, time_scale=0.05)
    assert fixed.violations == [], [v.message for v in fixed.violations]


def test_a_singleton_a_failed_step_dirtied_is_reported_as_carried_over(tmp_path: Path) -> None:
    fault = "http_error:status=500,p=1,steps=2"  # every request of step 2 fails: ref-step-singleton is fail-fast
    unfixed = _run("ref-step-singleton:unfixed", fault, on_step_failure="continue")
    carried = [v for v in unfixed.violations if v.invariant == "step_carryover"]
    assert [(v.evidence["step"], v.evidence["after_step"]) for v in carried] == [(3, 2), (4, 2)]
    assert all(v.evidence["error"]["type"] == "RolloutAborted" for v in carried)
    assert all(v.evidence["first_error"]["type"] == "ClientResponseError" for v in carried)
    # rerun alone in a fresh worker, the same step passes: the failure came from the process, not the inputs
    fresh = [v.evidence["fresh_process"] for v in carried]
    assert [f["verdict"] for f in fresh] == ["passes in a fresh process: carried over"] * 2
    assert [f["outcomes"] for f in fresh] == [{"completed": N}] * 2
    assert len({f["worker_pid"] for f in fresh} | {unfixed.worker["pid"]}) == 3  # type: ignore[index]
    assert unfixed.steps["first_violation"]["step"] == 3  # type: ignore[index]
    assert _names(unfixed) == ["step_carryover", "step_carryover"]  # step 2 failed closed on the fault: correct
    suite = ET.parse(write_junit(unfixed, tmp_path / "unfixed.xml")).getroot()  # CI sees the finding, not 0 failures
    failed = {case.get("name"): case.find("failure") for case in suite if case.find("failure") is not None}
    assert suite.get("failures") == "1" and list(failed) == ["step_carryover"]
    assert "step 3 failed after step 2 had failed" in (failed["step_carryover"].text or "")
    fixed = _run("ref-step-singleton:fixed", fault, on_step_failure="continue")
    assert fixed.violations == [], [v.message for v in fixed.violations]
    passed = ET.parse(write_junit(fixed, tmp_path / "fixed.xml")).getroot()
    assert passed.get("failures") == "0" and "step_carryover" in {case.get("name") for case in passed}
    outcomes = {row["step"]: (row["n_completed"], row["n_lost"]) for row in fixed.steps["rows"]}  # type: ignore[index]
    assert outcomes == {0: (N, 0), 1: (N, 0), 2: (0, N), 3: (N, 0), 4: (N, 0)}  # the step after the failure runs


def test_a_later_step_that_differs_from_a_fresh_process_is_caught_when_asked(tmp_path: object) -> None:
    """`compare_fresh`: the last clean step rerun in a fresh worker. ref-step-drift:unfixed's backoff lowers a
    process-wide length limit, so step 4 clips what a fresh process keeps whole, and nothing raises."""
    unfixed = _run("ref-step-drift:unfixed", compare_fresh=True)
    assert _names(unfixed) == ["step_fresh_process"], [v.message for v in unfixed.violations]
    evidence = unfixed.violations[0].evidence
    assert (evidence["step"], evidence["count"]) == (K - 1, N)
    assert all(d["outcome"] == {"in_step": "truncated", "fresh": "completed"} for d in evidence["differ"])
    assert all(d["response_ids"]["in_step_length"] < d["response_ids"]["fresh_length"] for d in evidence["differ"])
    assert evidence["fresh_process"]["worker_pid"] != unfixed.worker["pid"]  # type: ignore[index]
    assert unfixed.steps["first_violation"]["step"] == K - 1  # type: ignore[index]
    # opt-in: without it the drift passes unseen (no other check sees results that differ without raising)
    assert _run("ref-step-drift:unfixed").violations == []
    fixed = _run("ref-step-drift:fixed", compare_fresh=True)
    assert fixed.violations == [], [v.message for v in fixed.violations]
    comparison = fixed.steps["fresh_comparison"]  # type: ignore[index]
    assert (comparison["step"], comparison["trajectories"], comparison["differ"]) == (K - 1, N, 0)
    with pytest.raises(ValueError, match="compare_fresh needs steps >= 2"):
        RunConfig(compare_fresh=True)
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "ref-step-drift:fixed", "--steps", "2",
                           "--n", "4", "--plan", "none", "--compare-fresh", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"fresh process +step 1 rerun in a fresh worker: 0 of 4 trajectories differ", done.stdout)


def test_training_on_samples_older_than_the_declared_bound_is_caught() -> None:
    """ref-step-async hands the trainer one group a step from a buffer that grows by two: by step 3 it trains on
    samples served two steps earlier. Its framework declares it accepts 1 version (`max_staleness`), so `step_lag`
    names the steps and samples past it; declared 2, the same run is within bound; the fixed variant drops what is
    older than the bound before training."""
    unfixed = _run("ref-step-async:unfixed", n=8)
    lag = [v for v in unfixed.violations if v.invariant == "step_lag"]
    assert [(v.evidence["step"], v.evidence["max_lag"], v.evidence["bound"]) for v in lag] == [(3, 2, 1), (4, 2, 1)]
    oldest = lag[0].evidence["samples"][0]
    assert (oldest["generated_in_step"], oldest["trained_in_step"], oldest["weight_versions"]) == (1, 3, ["1"])
    assert _names(unfixed) == ["step_lag", "step_lag"]  # the emission-order staleness check does not see it
    assert [row["max_lag"] for row in unfixed.steps["rows"]] == [0, 1, 1, 2, 2]  # type: ignore[index]
    assert unfixed.steps["first_violation"]["step"] == 3  # type: ignore[index]
    declared = _run("ref-step-async:unfixed", n=8, target_options={"max_staleness": 2})
    assert declared.violations == [] and declared.config.bounds.max_weight_lag == 2
    from bench.invariants import Bounds

    widened = _run("ref-step-async:unfixed", n=8, bounds=Bounds(max_weight_lag=2))  # `--max-weight-lag 2`
    assert widened.violations == [], [v.message for v in widened.violations]
    fixed = _run("ref-step-async:fixed", n=8)
    assert fixed.violations == [], [v.message for v in fixed.violations]
    assert [row["max_lag"] for row in fixed.steps["rows"]] == [0, 1, 1, 1, 1]  # type: ignore[index]
    assert {r.trajectory[:6] for r in fixed.records if r.outcome == "dropped"} == {"g00003", "g00005"}


def test_stop_ends_the_run_at_the_failed_step() -> None:
    result = _run("ref-step-singleton:unfixed", "http_error:status=500,p=1,steps=2")
    assert result.steps is not None and (result.steps["ran"], result.steps["steps"]) == (3, K)
    assert len(result.records) == 3 * N  # the steps after the stop were never dispatched: none of theirs is lost
    assert {r.step for r in result.records if r.outcome == "lost"} == {2}
    assert result.batch_error is not None and result.batch_error.type == "ClientResponseError"
    assert result.violations == []  # fail-fast on an injected fault, then stopped: correct


def test_weights_advance_per_step_unless_a_plan_holds_them() -> None:
    result = _run("ref-step-leak:fixed", "hold_weights:steps=2-3", steps=K, target_options={"leak": "threads"})
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["weight_version"] for row in rows] == ["0", "1", "1", "1", "4"]
    assert [row["versions_served"] for row in rows] == [["0"], ["1"], ["1"], ["1"], ["4"]]
    assert rows[2]["weights_held_by"] == ["hold_weights#0"]
    assert [row["max_lag"] for row in rows] == [0] * K  # each sample was served its step's weights
    by_step = {r.step: set(r.weight_versions) for r in result.records}  # what the samples say they were served
    assert by_step == {0: {"0"}, 1: {"1"}, 2: {"1"}, 3: {"1"}, 4: {"4"}}


SYNC = ["/pause_generation", "/flush_cache", "/update_weights_from_tensor", "/continue_generation"]


def _admin_calls(result: RunResult) -> list[str]:
    """The requests that named no trajectory (the trainer side's admin calls), the step reports apart."""
    return [q.endpoint for q in result.requests if q.trajectory is None and q.endpoint != "/bench/step"]


def test_an_adapter_publishing_its_own_weights_drives_the_version_and_a_forgotten_sync_is_caught() -> None:
    """ref-step-weights' trainer side publishes each step's weights through the admin routes (pause, flush,
    update with the version, continue). The bench then publishes nothing: the unfixed trainer, which skips its
    sync before step 2, has step 2 served v1 (the bench would have published v2) while it trains as v2."""
    fixed = _run("ref-step-weights:fixed")
    assert fixed.violations == [], [v.message for v in fixed.violations]
    rows = fixed.steps["rows"]  # type: ignore[index]
    assert [(r["published_by"], r["trainer_version"], r["weight_version"]) for r in rows] == [
        ("adapter", str(k), str(k)) for k in range(K)]
    assert [row["versions_served"] for row in rows] == [[str(k)] for k in range(K)]
    assert _admin_calls(fixed) == SYNC * K  # each step's sync, in the trainer's order, before the step's requests
    step_of = {r.trajectory: r.step for r in fixed.records}
    synced = [q.started for q in fixed.requests if q.endpoint == "/continue_generation"]
    assert all(q.started > synced[step_of[q.trajectory]] for q in fixed.requests if q.trajectory in step_of)
    unfixed = _run("ref-step-weights:unfixed")
    assert _names(unfixed) == ["step_weights"], [v.message for v in unfixed.violations]
    evidence = unfixed.violations[0].evidence
    assert (evidence["step"], evidence["trainer_version"], evidence["server_version"]) == (2, "2", "1")
    assert evidence["versions_served"] == ["1"] and evidence["admin_requests"] == []  # no sync was sent
    assert "weights not updated for step 2" in unfixed.violations[0].message
    rows = unfixed.steps["rows"]  # type: ignore[index]
    assert [row["weight_version"] for row in rows] == ["0", "1", "1", "3", "4"]
    assert [row["max_lag"] for row in rows] == [0, 0, 1, 0, 0]  # step 2 trained as v2 on what v1 generated
    assert unfixed.steps["first_violation"]["step"] == 2  # type: ignore[index]


def test_a_sync_that_drops_its_version_is_caught_for_a_trainer_whose_syncs_name_one() -> None:
    """ref-step-weights (slime-like: every sync names its version) with step 2's update sent naming none: the
    server takes it and keeps v1. Only an adapter declaring versionless syncs (AReaL, verl) is excused that."""
    unfixed = _run("ref-step-weights:unfixed", target_options={"drop_version": 2})
    assert _names(unfixed) == ["step_weights"], [v.message for v in unfixed.violations]
    evidence = unfixed.violations[0].evidence
    assert (evidence["step"], evidence["trainer_version"], evidence["server_version"]) == (2, "2", "1")
    assert "/update_weights_from_tensor" in [c["endpoint"] for c in evidence["admin_requests"]]  # sent, unnamed


def test_a_held_step_keeps_the_adapters_update_out() -> None:
    """Under `hold_weights` the update routes answer as usual and change nothing during the rule's steps: the
    trainer moves on, the server keeps v1, and what steps 2 and 3 train on lags behind the trainer's weights."""
    held = _run("ref-step-weights:fixed", "hold_weights:steps=2-3")
    rows = held.steps["rows"]  # type: ignore[index]
    assert [row["weight_version"] for row in rows] == ["0", "1", "1", "1", "4"]
    assert [row["updates_kept_out"] for row in rows] == [0, 0, 1, 1, 0]
    assert [row["max_lag"] for row in rows] == [0, 0, 1, 2, 0]
    weights = [v for v in held.violations if v.invariant == "step_weights"]
    assert [v.evidence["step"] for v in weights] == [2, 3]
    assert all(v.evidence["held_by"] == ["hold_weights#0"] for v in weights)
    assert [u["endpoint"] for u in weights[0].evidence["ignored_updates"]] == ["/update_weights_from_tensor"]
    assert "kept out by hold_weights#0" in weights[0].message
    assert _names(held) == ["step_lag", "step_weights", "step_weights"]  # step 3: 2 versions behind, past 1
    assert _admin_calls(held) == SYNC * K  # every sync was sent and answered


def test_a_rule_scheduled_by_step_fires_only_in_its_steps() -> None:
    result = _run("ref-gather:fixed", "missing_logprobs:p=1,steps=1,3", steps=4)
    steps_hit = {result.steps and next(r.step for r in result.records if r.trajectory == e.trajectory)
                 for e in result.fault_events}
    assert steps_hit == {1, 3}
    assert len(result.fault_events) == 2 * N


def test_steps_must_fit_the_trace_and_keep_groups_whole() -> None:
    with pytest.raises(StepsError, match="has 500"):
        _run("ref-gather:fixed", steps=3, n=200)
    with pytest.raises(StepsError, match="split across two steps"):
        _run("ref-gather:fixed", steps=2, n=3)
    with pytest.raises(ValueError, match="steps=0"):
        RunConfig(steps=0)
    with pytest.raises(ValueError, match="on_step_failure"):
        RunConfig(steps=2, on_step_failure="retry")


def test_the_command_line_refuses_bad_step_arguments_up_front() -> None:
    for bad in (["--steps", "0"], ["--steps", "two"], ["--on-step-failure", "retry"]):
        done = subprocess.run([sys.executable, "-m", "bench", "run", *bad], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done.stderr
        assert "--steps" in done.stderr or "--on-step-failure" in done.stderr


def test_one_step_runs_as_before_and_inline_runs_steps_unmeasured() -> None:
    one = _run("ref-gather:fixed", steps=1)
    assert one.steps is None and {r.step for r in one.records} == {0}
    inline = _run("ref-gather:fixed", steps=3, isolation="inline")
    assert inline.violations == [] and len(inline.records) == 3 * N
    assert [row["tasks"] for row in inline.steps["rows"]] == [None] * 3  # type: ignore[index]


def test_the_command_line_writes_the_per_step_table_and_plot(tmp_path: object) -> None:
    import csv
    from pathlib import Path

    out = Path(str(tmp_path)) / "report"
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "ref-step-leak:unfixed", "--steps", "4",
                           "--n", "4", "--plan", "none", "--target-option", "leak=threads", "--out", str(out),
                           "--repro-reruns", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr  # a violation: the leak
    assert "4 of 4 ran (on step failure: stop)" in done.stdout
    assert re.search(r"first violation +step 1: step_resources: threads grow with steps", done.stdout), done.stdout
    rows = list(csv.DictReader((out / "steps.csv").open()))
    assert [row["step"] for row in rows] == ["0", "1", "2", "3"]
    assert [int(row["threads"]) - int(rows[0]["threads"]) for row in rows] == [0, 1, 2, 3]
    assert (out / "steps.png").stat().st_size > 10_000
    assert "steps = 4" in (out / "run.toml").read_text()  # the rerun of the whole run is a multi-step run too
    table = load(out)["steps"]  # the notebook API has the per-step table too, as steps.csv has it
    assert table["step"].tolist() == [0, 1, 2, 3] and table["threads"].tolist() == [int(r["threads"]) for r in rows]


def test_a_multi_step_repro_reruns_the_run_up_to_its_failing_step(tmp_path: object) -> None:
    """The pytest plugin's `bench_run(target, steps=K)` writes repros through `write_repro`: a multi-step run's is
    the run cut after the step the finding points at (a resource's growth keeps the 4 steps it needs to show: warm-up and 3),
    verified by the bench rerunning it; `run.toml` still reruns the whole run."""
    from pathlib import Path

    from bench.orchestration.repro import load_repro, write_repro

    result = _run("ref-step-leak:unfixed", target_options={"leak": "children"})
    assert [v.invariant for v in result.violations] == ["step_resources"]
    assert result.violations[0].evidence["first_step"] == 1
    path = write_repro(result, Path(str(tmp_path)) / "repro.toml")
    assert path is not None  # seen failing the same way in a rerun
    repro = load_repro(path)
    assert (repro.config.steps, repro.config.on_step_failure, repro.invariant) == (MIN_STEPS_FOR_GROWTH, "stop",
                                                                                   "step_resources")
    assert repro.config.trajectories == [r.trajectory for r in result.records[:MIN_STEPS_FOR_GROWTH * N]]
    assert "verified = {reruns = 1," in path.read_text()
    whole = load_repro(Path(str(tmp_path)) / "run.toml").config
    assert (whole.steps, whole.n, whole.trajectories) == (K, N, None)
    again = run_blocking(repro.config)
    assert [v.invariant for v in again.violations] == ["step_resources"]
    assert again.steps is not None and again.steps["ran"] == MIN_STEPS_FOR_GROWTH


def test_a_carried_over_failure_gets_a_repro_of_its_steps_that_the_command_line_reruns(tmp_path: object) -> None:
    """step_carryover at step 3 (step 2 failed on its fault): the repro is steps 0-3 with the step-2 rule kept as
    scheduled and `continue` kept; `rollout-bench run --repro` shows the same finding, and the fixed variant run
    from the same file passes."""
    from pathlib import Path

    from bench.orchestration.repro import load_repro, write_repro

    result = _run("ref-step-singleton:unfixed", "http_error:status=500,p=1,steps=2", on_step_failure="continue")
    assert _names(result) == ["step_carryover", "step_carryover"]
    path = write_repro(result, Path(str(tmp_path)) / "repro.toml")
    assert path is not None
    repro = load_repro(path)
    assert (repro.config.steps, repro.config.on_step_failure) == (4, "continue")
    assert [rule.schedule.steps is not None and 2 in rule.schedule.steps
            for rule in repro.config.plan.rules] == [True]  # type: ignore[union-attr]
    out = Path(str(tmp_path)) / "rerun"
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(path), "--out", str(out),
                           "--repro-reruns", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "4 of 4 ran (on step failure: continue)" in done.stdout
    assert re.search(r"first violation +step 3: step_carryover", done.stdout), done.stdout
    fixed = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(path), "--target",
                            "ref-step-singleton:fixed", "--out", str(out) + "-fixed", "--repro-reruns", "0"],
                           capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_a_step_that_hangs_ends_the_run_there() -> None:
    """Step 1's requests get no answer (`stall`): the watchdog ends the run in step 1; step 0's samples stand,
    step 1's are lost to the hang, step 2 never started (its trajectories were never dispatched)."""
    result = _run("ref-step-leak:fixed", "stall:p=1,steps=1", steps=3, watchdog_s=8.0,  # a loaded CI machine may pause step 0 for seconds
                  target_options={"leak": "threads"})
    assert result.hang is not None and result.hang.kind == "hang"
    assert result.steps is not None and result.steps["ran"] == 2
    outcomes = {(r.step, r.outcome, r.error.type if r.error else None) for r in result.records}
    assert outcomes == {(0, "completed", None), (1, "lost", "Hang")}
    assert _names(result) == ["liveness"]


def test_a_sweep_runs_every_point_for_k_steps_and_tables_the_step_first_violated(tmp_path: Path) -> None:
    """`sweep --steps K` passes the steps to every run; its table says how many ran and which step first failed."""
    plan = tmp_path / "step-two-fails.toml"
    plan.write_text('name = "step-two-fails"\nseed = 1\n\n[[rules]]\nfault = "http_error"\nstatus = 500\n'
                    'p = 1\nsteps = "2"\n', encoding="utf-8")
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "bench", "sweep", "--plan", str(plan),
                           "--target", "ref-step-singleton:unfixed,ref-step-singleton:fixed", "--rates", "1",
                           "--seeds", "1", "--trace", TRACE, "--n", str(N), "--steps", str(K),
                           "--on-step-failure", "continue", "--time-scale", "0", "--jobs", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]  # the unfixed target's run found a carried-over failure
    table = load(out)["runs"].set_index("target")
    unfixed, fixed = table.loc["ref-step-singleton:unfixed"], table.loc["ref-step-singleton:fixed"]
    assert (unfixed["outcome"], unfixed["steps_ran"], unfixed["first_violation_step"]) == ("violations", K, 3)
    assert "step_carryover" in unfixed["violated_invariants"]
    assert (fixed["outcome"], fixed["steps_ran"]) == ("ok", K) and pd.isna(fixed["first_violation_step"])
    assert fixed["trajectories"] == K * N  # every step's slice, not one step's
    shown = subprocess.run([sys.executable, "-m", "bench", "report", str(out)], capture_output=True, text=True,
                           timeout=120)
    header = shown.stdout.splitlines()[0].split()
    assert shown.returncode == 0 and header[-2:] == ["steps_ran", "first_violation_step"], shown.stdout


def _sweep(out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", "sweep", *options, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


def test_a_sweep_passes_compare_fresh_to_every_run_and_a_resume_keeps_it(tmp_path: Path) -> None:
    """`sweep --compare-fresh` (with `--steps`) reruns each run's last clean step in a fresh worker, as `run` does:
    ref-step-drift:unfixed's later steps differ from a fresh process and only that comparison sees it. A resume
    takes the option from the sweep's record, and refuses a sweep that ran without it."""
    grid = ["--plan", "seed-000", "--target", "ref-step-drift:unfixed,ref-step-drift:fixed", "--rates", "0", "--seeds",
            "1", "--trace", TRACE, "--n", str(N), "--steps", "3", "--time-scale", "0", "--jobs", "2"]
    out = tmp_path / "sweep"
    done = _sweep(out, *grid, "--compare-fresh")
    assert done.returncode == 1, done.stderr[-3000:]
    table = load(out)["runs"].set_index("target")
    unfixed, fixed = table.loc["ref-step-drift:unfixed"], table.loc["ref-step-drift:fixed"]
    assert (unfixed["outcome"], unfixed["violated_invariants"], unfixed["first_violation_step"]) == (
        "violations", "step_fresh_process", 2)
    assert (fixed["outcome"], fixed["steps_ran"]) == ("ok", 3)
    assert json.loads((out / "sweep.json").read_text())["options"]["compare_fresh"] is True
    resumed = _sweep(out, "--resume", str(out))  # nothing missing: the record's options, no run again
    assert resumed.returncode == 1 and "0 to run" in resumed.stderr, resumed.stderr[-3000:]
    without = tmp_path / "without"
    assert _sweep(without, *grid).returncode == 0  # the drift passes unseen without the comparison
    refused = _sweep(without, "--resume", str(without), "--compare-fresh")
    assert refused.returncode == 2
    assert "--compare-fresh: the sweep ran False, this command gives True" in refused.stderr


def test_sweep_refuses_compare_fresh_without_steps(tmp_path: Path) -> None:
    done = _sweep(tmp_path / "s", "--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.1", "--seeds",
                  "1", "--compare-fresh")
    assert done.returncode == 2 and "--compare-fresh needs --steps 2 or more" in done.stderr
    assert not (tmp_path / "s").exists()


def test_sweep_refuses_steps_below_one_before_any_run(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "sweep", "--plan", "seed-000", "--target", "ref-gather:fixed",
                           "--rates", "0.1", "--seeds", "1", "--steps", "0", "--out", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--steps" in done.stderr and not (tmp_path / "s").exists()


def test_a_step_plan_keeps_the_runs_window_clock() -> None:
    """A step narrows the run's plan to its rules: a `window` keeps counting from the run's first request."""
    from bench.steps.board import plan_for_step
    from faults.engine import FaultEngine

    plan = plan_from_specs(["missing_logprobs:p=1,steps=1", "abort:p=1"], 0)
    engine = FaultEngine(plan_for_step(plan, 0))
    engine.elapsed(engine.plan)  # the run's first request starts the clock
    started = engine.first_request
    engine.swap(plan_for_step(plan, 1), keep_clock=True)  # what the step board does
    assert engine.first_request == started
    engine.swap(plan_for_step(plan, 2))  # a plan swapped in by a user (PUT /bench/plan) counts from its own start
    assert engine.first_request is None
