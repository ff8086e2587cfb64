"""Process isolation: a target's crash, hang, leak or chatter stays in its worker process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bench import ErrorInfo, RolloutJob, RunConfig, RunResult, SampleRecord, TrajectorySpec, run, run_blocking
from bench.isolation import IsolatedTarget
from bench.isolation.protocol import job_from_json, job_to_json, record_from_dict, record_to_dict
from bench.targets.frameworks.envs import target_python
from faults import resolve_plan
from tests.process_helpers import alive


def _run(target: str, **options: object) -> RunResult:
    config = RunConfig(plan=resolve_plan("seed-000"), target=target, **options)  # type: ignore[arg-type]
    return asyncio.run(run(config))


def test_job_and_records_cross_the_process_boundary_unchanged() -> None:
    plan = resolve_plan("seed-004")
    spec = TrajectorySpec("t-0", "g-0", [1, 2, 3], "hi", [{"role": "user", "content": "hi"}], None,
                          {"max_new_tokens": 8, "temperature": 1.0}, 3)
    job = RolloutJob("http://127.0.0.1:1", [spec], 4096, __import__("pathlib").Path("/tok"), 8, 4,
                     list(plan.rules), {"mode": "eval"})
    assert job_from_json(job_to_json(job)) == job
    record = SampleRecord("t-0", "g-0", "aborted", "ABORTED", 3, [5], [float("nan")], [0], 1, 0.0, ["v1"],
                          ErrorInfo("KeyError", "'x'", "Traceback ..."), {"error": {"class": "ModelError"}})
    back = record_from_dict(record_to_dict(record))
    assert back.error == record.error and back.details == record.details and back.logprobs[0] != back.logprobs[0]


def test_process_and_inline_runs_see_the_same_faults_and_outcomes() -> None:
    isolated, inline = _run("ref-gather:fixed", isolation="process"), _run("ref-gather:fixed", isolation="inline")
    assert isolated.isolation == "process" and isolated.worker is not None and isolated.worker["pid"] != os.getpid()
    assert [(e.rule, e.trajectory, e.turn, e.attempt) for e in isolated.fault_events] == \
           [(e.rule, e.trajectory, e.turn, e.attempt) for e in inline.fault_events] != []
    assert [(r.trajectory, r.outcome) for r in isolated.records] == [(r.trajectory, r.outcome) for r in inline.records]
    assert isolated.ok and not alive(isolated.worker["pid"])


def test_the_rollouts_exception_arrives_with_its_original_type_and_traceback() -> None:
    result = _run("ref-gather:unfixed", n=None)
    assert result.batch_error is not None and result.batch_error.type == "InjectedFault"
    assert "raise_if_poisoned" in result.batch_error.traceback
    assert result.target_returned_at is not None and result.worker is not None


def test_a_worker_that_dies_is_a_result_and_the_next_run_works() -> None:
    died = _run("tests.isolation_targets:DiesHard", n=6)
    assert died.batch_error is not None and died.batch_error.type == "WorkerDied"
    assert "status 9" in died.batch_error.message
    assert [r.outcome for r in died.records] == ["completed"] * 2 + ["lost"] * 4
    assert {v.invariant for v in died.violations} >= {"batch_survival"}
    again = _run("ref-gather:fixed", n=8, time_scale=0.0)
    assert len(again.records) == 8 and again.batch_error is None


def test_leaked_tasks_threads_and_stdout_chatter_stay_in_the_worker() -> None:
    threads_before = {t.name for t in __import__("threading").enumerate()}
    result = _run("tests.isolation_targets:LeaksAndRaises", n=5)
    assert result.batch_error is not None and result.batch_error.type == "KeyError"
    assert [r.outcome for r in result.records] == ["completed"] * 4 + ["lost"]
    assert result.orphans_cancelled == 3  # the three tasks it left behind, counted by the worker
    assert result.worker is not None and not alive(result.worker["pid"])  # its non-daemon thread died with it
    assert {t.name for t in __import__("threading").enumerate()} <= threads_before
    log = result.worker_log or ""  # kept in memory (capped), written by the report as worker.log
    assert "framework chatter on stdout" in log


def test_a_blocked_event_loop_is_reported_as_a_hang_with_the_threads_stacks(tmp_path: Path) -> None:
    from bench.report import format_summary, write_report

    result = _run("tests.isolation_targets:BlocksTheLoop", n=4, watchdog_s=1.0)
    assert result.hang is not None and result.hang.stacks
    assert any("_spin_in_place" in stack for stack in result.hang.stacks)
    assert [r.outcome for r in result.records] == ["completed"] + ["lost"] * 3
    assert "liveness" in {v.invariant for v in result.violations}
    assert result.worker is not None and not alive(result.worker["pid"])
    summary = write_report(result, tmp_path / "report")  # the terminal says where the stacks are, and they are there
    assert "(their stacks: the liveness violation's evidence in summary.json)" in format_summary(summary)
    written = json.loads((tmp_path / "report" / "summary.json").read_text())
    liveness = next(v for v in written["violations"] if v["invariant"] == "liveness")
    assert any("_spin_in_place" in stack for stack in liveness["evidence"]["stacks"])


def test_a_missing_interpreter_or_unknown_attribute_is_a_clear_start_error() -> None:
    from bench.isolation import TargetStartError

    with pytest.raises(TargetStartError, match="cannot start the worker interpreter /nonexistent/python"):
        _run("ref-gather:fixed", n=2, python="/nonexistent/python")
    with pytest.raises(TargetStartError, match="has no attribute 'Nothing'"):
        _run("tests.isolation_targets:Nothing", n=2)


def _same_environment_elsewhere(folder: Path) -> Path:
    """An interpreter at another path that runs as this one does (its pyvenv.cfg, its libraries): one a user gives."""
    venv = Path(sys.prefix)
    (folder / "bin").mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (folder / "lib").symlink_to(venv / "lib")
    (folder / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    return folder / "bin" / "python"


def test_a_framework_target_without_its_environment_says_where_it_looked_and_how_to_build_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from bench.isolation import TargetStartError

    if importlib.util.find_spec("miles") is not None:
        pytest.skip("miles is installed in the bench's own environment: its worker would start")
    monkeypatch.setenv("ROLLOUT_BENCH_TARGETS_DIR", str(tmp_path))  # an empty folder: no environment built there
    monkeypatch.delenv("ROLLOUT_BENCH_MILES_PYTHON", raising=False)
    with pytest.raises(TargetStartError) as caught:
        _run("miles", n=2)  # falls back to the bench's interpreter, which has no miles
    message = str(caught.value)
    assert f"could not start under {sys.executable}: ModuleNotFoundError: No module named 'miles'" in message
    assert str(tmp_path / "miles" / "bin" / "python") in message and "make targets TARGETS=miles" in message
    assert "ROLLOUT_BENCH_TARGETS_DIR" in message
    given_python = _same_environment_elsewhere(tmp_path / "given")  # the bench's environment under another path
    with pytest.raises(TargetStartError) as given:  # an interpreter the user gave: no advice to give one
        _run("miles", n=2, python=str(given_python))
    assert f"could not start under {given_python}" in str(given.value) and "make targets" not in str(given.value)
    with pytest.raises(TargetStartError) as plugin:
        _run("no_such_plugin_module:Target", n=2)  # a plug-in's import error (found before its worker) names no env
    assert "No module named 'no_such_plugin_module'" in str(plugin.value) and "make targets" not in str(plugin.value)


def test_python_needs_a_process() -> None:
    with pytest.raises(ValueError, match="isolation='process'"):
        RunConfig(isolation="inline", python=sys.executable)
    with pytest.raises(ValueError, match="isolation 'thread'"):
        RunConfig(isolation="thread")


@pytest.mark.skipif(target_python("verifiers") is None, reason="the verifiers environment is not built (make targets)")
def test_a_target_runs_under_another_environments_interpreter() -> None:
    python = target_python("verifiers")
    assert python is not None
    result = _run("tests.isolation_targets:ReportsInterpreter", n=3, python=python)
    assert {r.details["python"] for r in result.records if r.details} == {python}
    assert not any(r.details["sees_pytest"] for r in result.records if r.details)  # not the bench's site-packages
    assert result.worker is not None and result.worker["versions"].get("verifiers") == "0.1.14"
    assert "torch" not in result.worker["versions"]  # the bench pulls no torch into a target's environment


def test_isolated_target_reports_its_worker() -> None:
    target = IsolatedTarget("ref-gather:fixed")
    assert target.describe()["python"] == sys.executable and target.describe()["pid"] is None


def test_the_bench_core_stays_light_enough_for_a_training_environment() -> None:
    """Teams install the bench beside their trainer: its own dependencies must not pin a stack."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    names = {dep.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()
             for dep in project["dependencies"]}
    assert names and not names & {"torch", "ray", "transformers", "vllm", "sglang", "verifiers", "miles-rl"}


def test_the_report_shows_throughput_bench_overhead_and_the_work_a_crash_threw_away(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.report import format_summary, write_report
    from bench.server.router import GENERATION_ROUTES

    crashed = _run("ref-gather:unfixed", time_scale=0.05)
    summary = write_report(crashed, tmp_path / "crashed")
    lost = {r.trajectory for r in crashed.records if r.outcome == "lost"}
    served_for_lost = [q for q in crashed.requests if q.trajectory in lost]
    assert lost and summary["orphaned_requests"] == len(served_for_lost) > 0
    assert f"{len(served_for_lost)} sent for trajectories the crash lost (answered or cut)" in format_summary(summary)
    throughput = summary["throughput"]
    assert throughput["samples_per_s"] == round((500 - len(lost)) / crashed.duration_s, 3)
    assert throughput["bench_cpu_s"] > 0 and 0 < throughput["bench_cpu_share"] <= 2  # two cores at most
    assert throughput["target_cpu_s"] > 0  # measured in the worker, apart from the bench's
    generation = [q for q in crashed.requests if q.endpoint in GENERATION_ROUTES]
    assert generation
    assert throughput["bench_cpu_us_per_request"] == round(crashed.bench_cpu_s / len(generation) * 1e6, 1)
    assert f"{throughput['bench_cpu_us_per_request']:g} µs per request" in format_summary(summary)
    assert (tmp_path / "crashed" / "worker.log").exists()
    fixed = write_report(_run("ref-gather:fixed", n=40), tmp_path / "fixed")
    assert fixed["orphaned_requests"] == 0 and fixed["isolation"] == "process"


def test_bench_cpu_per_request_counts_only_generation_requests() -> None:
    """A target's health checks and model-info calls are cheap and its own habit: they must not dilute the figure."""
    import pandas as pd

    from bench.report.summary import bench_cpu_us_per_request

    requests = pd.DataFrame({"endpoint": ["/generate", "/health", "/v1/chat/completions", "/get_model_info",
                                          "/v1/completions"]})
    assert bench_cpu_us_per_request(0.0009, requests) == 300.0  # 900 µs over the three generation requests
    assert bench_cpu_us_per_request(1.0, requests[requests["endpoint"] == "/health"]) is None
    assert bench_cpu_us_per_request(1.0, pd.DataFrame(columns=["endpoint"])) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_started_before_the_trace_failed_to_load_is_not_left_behind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The worker starts first (its imports overlap the trace loading); a bad trace must still end it."""
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not json\n")
    marker = "tests.isolation_targets:ReportsInterpreter"
    with pytest.raises(Exception):
        asyncio.run(run(RunConfig(trace=str(broken), target=marker)))
    assert _processes_running(marker) == []


def _processes_running(text: str) -> list[str]:
    from pathlib import Path

    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended while we looked
            continue
        if text in command:
            found.append(command)
    return found


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_targets_start_up_in_prepare_is_not_a_stall_but_a_slow_run_is(isolation: str) -> None:
    """`prepare(job)` (Ray and actors, for verl) may outlast the watchdog; the same wait inside `run` is a hang."""
    def run(target: str, **options: object) -> RunResult:
        return run_blocking(RunConfig(trace="rlvr-500", target=target, n=3, isolation=isolation, watchdog_s=1.0,
                                      target_options={"prepare_s": 2.5, "sleep_s": 2.5, **options}))

    prepared = run("tests.slow_start_target:Preparing")
    assert prepared.hang is None and [r.outcome for r in prepared.records] == ["completed"] * 3
    slow = run("tests.slow_start_target:SlowStart")
    assert slow.hang is not None and slow.hang.kind == "hang"
    failed = run("tests.slow_start_target:Preparing", prepare_fails=True, prepare_s=0.1)
    assert failed.batch_error is not None and "start-up failed" in failed.batch_error.message
    assert {r.outcome for r in failed.records} == {"lost"}
