"""The harness end to end: seed-000 on ref-gather, the watchdog, reports and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import RunConfig, RunResult, run
from bench.invariants import INVARIANTS
from bench.report import load, write_report
from faults import resolve_plan

POISONED = "g00120-3"  # the trajectory seed-000's plan hits in agentic-500


def _run(target: str, **options: object) -> RunResult:
    config = RunConfig(plan=resolve_plan("seed-000"), target=target, **options)  # type: ignore[arg-type]
    return asyncio.run(run(config))


@pytest.fixture(scope="module")
def unfixed() -> RunResult:
    return _run("ref-gather:unfixed")


def test_unfixed_gather_loses_the_batch_with_the_root_cause(unfixed: RunResult) -> None:
    assert unfixed.batch_error is not None and unfixed.batch_error.type == "InjectedFault"
    lost = [r for r in unfixed.records if r.outcome == "lost"]
    assert lost and all(r.error and r.error.type == "InjectedFault" for r in lost)
    survival = [v for v in unfixed.violations if v.invariant == "batch_survival"]
    assert len(survival) == 1 and survival[0].trajectory == POISONED
    assert survival[0].evidence["error_type"] == "InjectedFault" and survival[0].evidence["lost"] == len(lost)
    assert survival[0].fault is not None and survival[0].fault["fault"] == "raise_after_generate"
    assert {v.invariant for v in unfixed.violations} == {"batch_survival"}
    assert [e.trajectory for e in unfixed.fault_events] == [POISONED]


def test_fixed_gather_keeps_an_aborted_placeholder() -> None:
    fixed = _run("ref-gather:fixed")
    assert fixed.violations == [] and fixed.batch_error is None
    aborted = [r for r in fixed.records if r.outcome == "aborted"]
    assert [r.trajectory for r in aborted] == [POISONED]
    assert aborted[0].reward == 0.0 and aborted[0].loss_mask == [0] and aborted[0].error.type == "InjectedFault"
    assert sum(r.outcome == "completed" for r in fixed.records) == len(fixed.records) - 1


def test_report_folder_matches_the_run(unfixed: RunResult, tmp_path: Path) -> None:
    write_report(unfixed, tmp_path)
    report = load(tmp_path)
    trajectories, requests, faults = report["trajectories"], report["requests"], report["faults"]
    summary = report["summary"]
    assert len(trajectories) == len(unfixed.records) == summary["trajectories"]
    assert summary["outcomes"]["lost"] == (trajectories["outcome"] == "lost").sum() > 0
    assert len(requests) == len(unfixed.requests) and len(faults) == 1
    assert summary["drop_rate"] == pytest.approx(summary["outcomes"]["lost"] / len(trajectories))
    assert summary["drop_rate_by_fault"]["raise_after_generate"]["trajectories"] == 1
    assert summary["batch_error"]["type"] == "InjectedFault" and summary["seed"] == 2
    for plot in ("outcomes_by_fault.png", "request_timeline.png", "throughput.png"):
        assert (tmp_path / plot).stat().st_size > 5000
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    failed = [case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None]
    assert failed == ["batch_survival"] and suite.get("tests") == str(len(INVARIANTS))


def test_watchdog_reports_a_hang_and_leaves_nothing_behind() -> None:
    async def main() -> RunResult:
        result = await run(RunConfig(trace="rlvr-500", n=40, target="tests.targets_for_tests:Hangs",
                                     watchdog_s=1.0))
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return result

    result = asyncio.run(main())
    assert result.hang is not None and result.hang.stacks
    assert any("Hangs.run" in stack or "wait" in stack for stack in result.hang.stacks)
    assert [v.invariant for v in result.violations] == ["liveness"]
    assert sum(r.outcome == "lost" for r in result.records) == 20
    assert result.duration_s < 10


def test_accounting_catches_duplicates_and_missing() -> None:
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=8, target="tests.targets_for_tests:Duplicates")))
    kinds = {(v.invariant, v.trajectory) for v in result.violations}
    first, second = result.records[0].trajectory, result.records[1].trajectory
    assert kinds == {("accounting", first), ("accounting", second), ("group_completeness", second)}
    assert result.records[1].outcome == "lost" and result.batch_error is None


def test_run_command_exit_status_and_report(tmp_path: Path) -> None:
    failing = subprocess.run([sys.executable, "-m", "bench", "run", "--out", str(tmp_path / "a"),
                              "--junit", str(tmp_path / "a.xml")], capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1, failing.stderr
    assert "InjectedFault" in failing.stdout and "batch_survival" in failing.stdout
    assert "seed=2" in failing.stderr and (tmp_path / "a.xml").exists()
    passing = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "ref-gather:fixed", "--out",
                              str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert passing.returncode == 0, passing.stdout
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["violations"] == []
    bad = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown target 'nope'" in bad.stderr


def test_repro_file_reproduces_the_crash_on_one_trajectory(unfixed: RunResult, tmp_path: Path) -> None:
    from bench.orchestration.repro import load_repro, write_repro

    path = write_repro(unfixed, tmp_path / "repro.toml")
    assert path is not None
    repro = load_repro(path)
    assert repro.invariant == "batch_survival" and repro.config.trajectories == [POISONED]
    again = asyncio.run(run(repro.config))
    assert len(again.records) == 1 and again.records[0].outcome == "lost"
    assert [v.invariant for v in again.violations] == ["batch_survival"]
    assert again.batch_error is not None and again.batch_error.type == "InjectedFault"
    assert [(e.trajectory, e.turn, e.attempt) for e in again.fault_events] == [(POISONED, 0, 1)]
    cli = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(path), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "1 of 1 trajectories lost" in cli.stdout
    assert write_repro(asyncio.run(run(RunConfig(plan=resolve_plan("seed-000"), target="ref-gather:fixed"))),
                       tmp_path / "none.toml") is None


@pytest.mark.parametrize("prefix, replacement, says", [
    ("seed = ", 'seed = "abc"', "seed: not an integer: 'abc'"),
    ('fault = "', 'fault = "no_such_fault"', "rule 0: unknown fault 'no_such_fault'"),
    ("p = ", 'p = "often"', "rule 0: p: expected a probability"),
    ("concurrency = ", "concurrency = 0", "concurrency=0: needs at least 1"),
    ("max_weight_lag = ", "max_weigth_lag = 1", "bounds.max_weigth_lag: not a bound"),
], ids=["seed", "fault", "p", "concurrency", "bound"])
def test_a_broken_repro_file_names_the_key_and_its_line(unfixed: RunResult, tmp_path: Path, prefix: str,
                                                       replacement: str, says: str) -> None:
    from bench.orchestration.repro import load_repro, write_config
    from faults import PlanError

    lines = write_config(unfixed.config, tmp_path / "run.toml", result=unfixed).read_text().splitlines()
    number = next(n for n, line in enumerate(lines, start=1) if line.startswith(prefix))
    lines[number - 1] = replacement  # a hand edit gone wrong
    broken = tmp_path / "broken.toml"
    broken.write_text("\n".join(lines) + "\n")
    with pytest.raises(PlanError) as caught:
        load_repro(broken)
    assert str(caught.value).startswith(f"{broken}:{number}: {says}"), caught.value


_SIDE_WORK_SCRIPT = """
import asyncio, json, time
from bench import RunConfig, run
from faults import resolve_plan

ended = []

def burn_cpu():
    start = time.thread_time()
    while time.thread_time() - start < 1.0:
        pass
    ended.append(time.time())

# recorded latencies at a quarter speed: the run lasts seconds and the side work ends well inside it
config = RunConfig(trace="rlvr-500", plan=resolve_plan("seed-000"), target="ref-gather:fixed", n=8, time_scale=0.25)
asyncio.run(run(RunConfig(trace="rlvr-500", target="ref-gather:fixed", n=1)))  # first-run imports, not measured
plain = asyncio.run(run(config))
side = asyncio.run(run(config, while_starting=burn_cpu))
print(json.dumps({"plain": plain.bench_cpu_s, "side": side.bench_cpu_s,
                  "inside": bool(ended) and ended[0] < side.started + side.duration_s}))
"""


def test_work_done_while_the_worker_starts_is_not_the_benchs_overhead() -> None:
    """The command line loads its report writer on a thread during the worker's start: that CPU is not the
    server's or the checks', so `bench_cpu_s` must not count it. Measured in a fresh interpreter: process
    CPU time in this one includes whatever threads earlier tests left behind."""
    done = subprocess.run([sys.executable, "-c", _SIDE_WORK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"bench CPU: {figures['plain']:.3f} s plain, {figures['side']:.3f} s with 1 s of CPU on the side")
    assert figures["inside"]  # all of the side work fell inside the measured run
    assert abs(figures["side"] - figures["plain"]) < 0.45


def test_the_report_names_the_sglang_build_the_server_played(tmp_path: Path) -> None:
    """A behaviour judged is one SGLang build's (miles runs a fork whose flush rule differs): the report says which."""
    from bench.report import format_summary

    default = write_report(_run("ref-gather:fixed", n=8), tmp_path / "default")
    assert default["server"] == {"sglang_version": "0.5.15", "sglang_build": "sglang", "openai_flavor": "vllm",
                                 "router_version": "0.3.2"}
    assert "build sglang" not in format_summary(default)  # the default build is not announced
    fork = write_report(_run("ref-gather:fixed", n=8, server_options={"engine": "sglang-miles"}), tmp_path / "fork")
    assert fork["server"]["sglang_build"] == "sglang-miles"
    assert "SGLang 0.5.15, build sglang-miles" in format_summary(fork)
    assert json.loads((tmp_path / "fork" / "summary.json").read_text())["server"] == fork["server"]


def test_an_old_repro_files_event_with_params_that_are_not_a_table_is_named(tmp_path: Path) -> None:
    """Files from before rules were recorded list the fired events; a hand edit there is named too, not a TypeError."""
    from bench.orchestration.repro import load_repro
    from faults import PlanError

    old = tmp_path / "old.toml"
    old.write_text('trace = "rlvr-500"\ntarget = "ref-gather:fixed"\nplan = "seed-000"\nseed = 2\n\n[[events]]\n'
                   'rule = "r"\nfault = "abort"\ntrajectory = "g00000-0"\nturn = 0\nattempt = 1\nparams = "x"\n')
    with pytest.raises(PlanError) as caught:
        load_repro(old)
    assert str(caught.value) == f"{old}:6: event 0: params: not a table: 'x'"
