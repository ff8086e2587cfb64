"""Progress is a finished sample: a livelock ends the run, correct slow rollouts are left alone, a deadline
ends any run, and no process of a run survives its end, even when the bench itself is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench import RunConfig, RunResult, run
from bench.isolation.process import worker_env
from bench.isolation.warm_client import RUNTIME_ENV, start_warm
from bench.synth import synthesize
from tests.process_helpers import end, running, wait_until_gone

TARGETS = "tests.livelock_targets"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _run(target: str, *, trace: str = "rlvr-500", n: int | None = 4, **options: object) -> RunResult:
    config = RunConfig(trace=trace, n=n, target=f"{TARGETS}:{target}", time_scale=0.0,
                       **options)  # type: ignore[arg-type]
    return asyncio.run(run(config))


def _liveness(result: RunResult) -> list[dict[str, object]]:
    return [{"message": v.message, **v.evidence} for v in result.violations if v.invariant == "liveness"]


def _pids(pidfile: Path, timeout_s: float = 60.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while not pidfile.exists():
        assert time.monotonic() < deadline, f"the target never wrote {pidfile}"
        time.sleep(0.05)
    worker, child = (int(x) for x in pidfile.read_text().split())
    return worker, child


def test_requests_without_finished_samples_end_as_a_livelock_with_stacks(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = _run("LoopsOnOneTrajectory", watchdog_s=3.0, target_options={"pidfile": str(pidfile), "child": True})
    assert time.monotonic() - started < 30  # the target would loop for 45 s; an old bench waited for all of it
    assert result.hang is not None and result.hang.kind == "livelock" and result.hang.stacks
    assert any("LoopsOnOneTrajectory" in stack for stack in result.hang.stacks)
    [liveness] = _liveness(result)
    assert "livelock" in str(liveness["message"]) and liveness["kind"] == "livelock"
    assert int(liveness["requests_in_window"]) > 10 and float(liveness["requests_per_s"]) > 0  # type: ignore[arg-type]
    assert {r.outcome for r in result.records} == {"lost"}
    assert {r.error.type for r in result.records if r.error} == {"Livelock"}
    worker, child = _pids(pidfile)
    assert worker == (result.worker or {}).get("pid")
    assert wait_until_gone([worker, child], 5.0) == []


def test_a_retry_storm_over_trajectories_already_answered_is_a_livelock() -> None:
    result = _run("StormsEveryTrajectory", n=8, watchdog_s=2.0)
    assert result.hang is not None and result.hang.kind == "livelock"
    assert result.duration_s < 30
    assert [v["kind"] for v in _liveness(result)] == ["livelock"]


def test_a_run_where_nothing_flows_is_still_a_hang_not_a_livelock() -> None:
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=4, target="tests.targets_for_tests:Hangs",
                                       watchdog_s=1.0, isolation="inline")))
    assert result.hang is not None and result.hang.kind == "hang" and result.hang.requests_in_window == 0
    [liveness] = _liveness(result)
    assert "hung" in str(liveness["message"]) and "livelock" not in str(liveness["message"])


def test_a_correct_rollout_that_emits_only_at_the_end_is_not_a_livelock() -> None:
    """slime's `generate_rollout` returns the whole batch at once: the server's answers are its progress."""
    watchdog_s = 1.5
    result = _run("EmitsAtTheEnd", n=40, watchdog_s=watchdog_s, target_options={"sleep_s": 0.1})
    assert result.duration_s > 2 * watchdog_s  # longer than the watchdog, with no record until the end
    assert result.hang is None and result.violations == []
    assert {r.outcome for r in result.records} == {"completed"}


def test_a_slow_multi_turn_trajectory_that_advances_turn_by_turn_is_not_a_livelock(tmp_path: Path) -> None:
    """One long trajectory: no sample finishes for longer than the watchdog, but every turn is new work."""
    trace = synthesize("agentic", 8, 7, tmp_path / "agentic-8.jsonl")
    watchdog_s = 1.0
    result = asyncio.run(run(RunConfig(trace=str(trace), trajectories=["g00000-1"], time_scale=0.0,
                                       target=f"{TARGETS}:SlowMultiTurn", watchdog_s=watchdog_s,
                                       target_options={"sleep_s": 0.3})))
    assert result.duration_s > 2 * watchdog_s
    assert result.hang is None and _liveness(result) == []
    assert [r.outcome for r in result.records] == ["completed"]


def test_the_deadline_ends_a_run_that_is_slow_but_making_progress() -> None:
    started = time.monotonic()
    result = _run("SlowButSteady", n=40, watchdog_s=30.0, deadline_s=3.0, target_options={"sleep_s": 0.2})
    assert time.monotonic() - started < 20
    assert result.hang is not None and result.hang.kind == "deadline" and result.hang.stacks
    [liveness] = _liveness(result)
    assert "deadline" in str(liveness["message"]) and liveness["deadline_s"] == 3.0
    outcomes = [r.outcome for r in result.records]
    assert "completed" in outcomes and "lost" in outcomes  # it was making progress when the deadline came
    assert result.worker is not None and wait_until_gone([int(result.worker["pid"])], 5.0) == []


def test_a_run_that_ends_in_time_has_no_deadline_violation() -> None:
    result = _run("SlowButSteady", n=4, deadline_s=60.0, target_options={"sleep_s": 0.05})
    assert result.hang is None and result.violations == []


@pytest.mark.parametrize("end", ["return", "raise", "hang", "deadline"])
def test_no_process_of_a_run_survives_its_end(tmp_path: Path, end: str) -> None:
    pidfile = tmp_path / "pids"
    result = _run("SpawnsThenEnds", watchdog_s=30.0 if end == "deadline" else 1.0,
                  deadline_s=2.0 if end == "deadline" else 60.0,
                  target_options={"pidfile": str(pidfile), "child": True,
                                  "end": "hang" if end == "deadline" else end})
    expected = {"return": None, "raise": None, "hang": "hang", "deadline": "deadline"}[end]
    assert (result.hang.kind if result.hang else None) == expected
    assert (result.batch_error is not None) == (end == "raise")
    assert wait_until_gone(list(_pids(pidfile)), 5.0) == []


def _start_cli(pidfile: Path, out: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "2", "--time-scale", "0",
               "--target", f"{TARGETS}:SpawnsAndWaits", "--target-option", f"pidfile={pidfile}",
               "--target-option", "child=true", "--watchdog", "600", "--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _kill_cli_mid_run(tmp_path: Path, sig: signal.Signals) -> tuple[subprocess.Popen[bytes], int, int, int]:
    """Start `rollout-bench run`, kill it once its target runs; (the run, worker, its child, worker's parent)."""
    pidfile = tmp_path / "pids"
    cli = _start_cli(pidfile, tmp_path / "report")
    try:
        worker, child = _pids(pidfile)
        assert running(worker) and running(child) and worker != cli.pid
        parent = _parent(worker)
        cli.send_signal(sig)
        cli.wait(timeout=30)
    finally:
        end(cli)
    return cli, worker, child, parent


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_the_run_command_takes_its_worker_and_the_targets_children_along(
        tmp_path: Path, sig: signal.Signals) -> None:
    cli, worker, child, parent = _kill_cli_mid_run(tmp_path, sig)
    assert parent == cli.pid  # a cold worker
    left = wait_until_gone([worker, child], 5.0)
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert left == []
    if sig == signal.SIGTERM:  # the report of what came back, marked interrupted (tests/test_hardening_processes.py)
        assert cli.returncode == 128 + 15
        assert b"interrupted SIGTERM" in (cli.stderr.read() if cli.stderr else b"")
        assert json.loads((tmp_path / "report" / "summary.json").read_text())["interrupted"]["signal"] == "SIGTERM"


@pytest.fixture
def warm_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """A warm worker for this module's targets, in a private socket folder; the CLI's runs fork from it."""
    folder = Path(tempfile.mkdtemp(prefix="rbl-", dir="/tmp"))  # short: socket paths must fit 107 bytes
    monkeypatch.setenv(RUNTIME_ENV, str(folder))
    process, ready = start_warm(sys.executable, f"{TARGETS}:SpawnsAndWaits", {}, 120.0, worker_env(sys.executable),
                                tmp_path / "warm.log")
    yield int(ready["pid"])
    process.terminate()
    process.wait(timeout=15)
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()


def test_killing_the_run_command_ends_a_worker_forked_from_a_warm_worker(tmp_path: Path, warm_worker: int) -> None:
    cli, worker, child, parent = _kill_cli_mid_run(tmp_path, signal.SIGKILL)
    assert parent == warm_worker  # forked: its stdin is the run's pipe, passed over the socket
    left = wait_until_gone([worker, child], 5.0)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
    assert running(warm_worker)  # the warm worker itself serves on
    summary = tmp_path / "report" / "summary.json"
    assert not summary.exists()  # SIGKILL: no report, but nothing left running either
