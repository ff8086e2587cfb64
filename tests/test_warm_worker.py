"""Warm workers: a target imported once, each run a fork of it with the isolation a cold worker gives.

Each test starts its own warm worker under this interpreter with a private socket folder, so nothing
here can pick up (or disturb) a warm worker a developer left running.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench import RunConfig, RunResult, run
from bench.cli import main as cli_main
from bench.isolation.process import worker_env
from bench.isolation.warm_client import RUNTIME_ENV, socket_path, start_warm
from bench.orchestration.repro import load_repro, write_repro
from bench.targets.frameworks.envs import target_python
from faults import resolve_plan
from tests.process_helpers import alive

MODULE_TARGET = """
from bench import SampleRecord

VERSION = {version}


class Target:
    name = "warm-module:target"
    fail_fast = False

    async def run(self, job, emit):
        for spec in job.trajectories:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids),
                              details={{"version": VERSION}}))
"""


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rbw-", dir="/tmp"))  # short: socket paths must fit 107 bytes
    monkeypatch.setenv(RUNTIME_ENV, str(folder))
    yield folder
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()


class Warm:
    def __init__(self, spec: str, log: Path, python: str = sys.executable) -> None:
        self.process, self.ready = start_warm(python, spec, {}, 120.0, worker_env(python), log)
        self.pid = int(self.ready["pid"])
        self.log = log

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def warm_for(runtime: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[Warm] = []

    def start(spec: str) -> Warm:
        warm = Warm(spec, tmp_path / f"warm-{len(started)}.log")
        started.append(warm)
        return warm

    yield start
    for warm in started:
        warm.stop()


def _run(target: str, **options: Any) -> RunResult:
    config = RunConfig(plan=resolve_plan("seed-000"), target=target, **options)
    return asyncio.run(run(config))


def test_a_run_forks_from_the_warm_worker_and_sees_what_a_cold_run_sees(warm_for: Any) -> None:
    warm = warm_for("ref-gather:fixed")
    assert socket_path(sys.executable, "ref-gather:unfixed").exists()  # one warm worker per framework
    forked = _run("ref-gather:fixed", n=8, time_scale=0.0)
    cold = _run("ref-gather:fixed", n=8, time_scale=0.0, warm=False)
    assert forked.worker is not None and cold.worker is not None
    assert forked.worker["forked_from_warm"] is True and cold.worker["forked_from_warm"] is False
    assert forked.worker["pid"] not in (warm.pid, os.getpid())
    assert [(e.rule, e.trajectory, e.turn, e.attempt) for e in forked.fault_events] == \
        [(e.rule, e.trajectory, e.turn, e.attempt) for e in cold.fault_events]
    assert [(r.trajectory, r.outcome) for r in forked.records] == [(r.trajectory, r.outcome) for r in cold.records]
    assert not alive(forked.worker["pid"]) and warm.process.poll() is None


def test_a_forked_worker_that_dies_is_a_result_and_the_warm_worker_serves_the_next_run(warm_for: Any) -> None:
    warm = warm_for("tests.isolation_targets:ReportsInterpreter")
    died = _run("tests.isolation_targets:DiesHard", n=6)
    assert died.worker is not None and died.worker["forked_from_warm"] is True
    assert died.batch_error is not None and died.batch_error.type == "WorkerDied"
    assert "status 9" in died.batch_error.message  # the exit status comes from the warm worker, its parent
    assert [r.outcome for r in died.records] == ["completed"] * 2 + ["lost"] * 4
    first = _run("tests.isolation_targets:ReportsInterpreter", n=2)
    second = _run("tests.isolation_targets:ReportsInterpreter", n=2)
    pids = {r.details["pid"] for r in first.records} | {r.details["pid"] for r in second.records}
    assert len(pids) == 2 and warm.pid not in pids  # a fresh process per run, never the warm one
    assert {r.outcome for r in first.records + second.records} == {"completed"} and warm.process.poll() is None


def test_leaks_and_hangs_stay_in_the_forked_worker(warm_for: Any) -> None:
    warm = warm_for("tests.isolation_targets:ReportsInterpreter")
    leaky = _run("tests.isolation_targets:LeaksAndRaises", n=4)
    assert leaky.worker is not None and leaky.worker["forked_from_warm"] is True
    assert leaky.batch_error is not None and leaky.batch_error.type == "KeyError"
    assert leaky.worker["leaked_tasks"] == 3
    hung = _run("tests.isolation_targets:BlocksTheLoop", n=3, watchdog_s=2.0)
    assert hung.hang is not None and any("_spin_in_place" in stack for stack in hung.hang.stacks)
    assert hung.worker is not None and not alive(hung.worker["pid"])
    after = _run("tests.isolation_targets:ReportsInterpreter", n=2)
    assert [r.outcome for r in after.records] == ["completed"] * 2
    assert after.worker is not None and after.worker["forked_from_warm"] is True
    assert warm.process.poll() is None


def test_a_changed_source_file_retires_the_warm_worker_and_the_run_goes_cold(
        warm_for: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork would run the code imported at warm-up: after an edit (a fix under test) it must not."""
    package = tmp_path / "code" / "warm_code"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    module = package / "target.py"
    module.write_text(MODULE_TARGET.format(version=1))
    monkeypatch.syspath_prepend(str(package.parent))
    warm = warm_for("warm_code.target:Target")
    before = _run("warm_code.target:Target", n=2)
    assert before.worker is not None and before.worker["forked_from_warm"] is True
    assert {r.details["version"] for r in before.records} == {1}
    module.write_text(MODULE_TARGET.format(version=2))
    stamp = time.time() + 5  # a different mtime even on a coarse clock
    os.utime(module, (stamp, stamp))
    after = _run("warm_code.target:Target", n=2)
    assert after.worker is not None and after.worker["forked_from_warm"] is False
    assert "stale" in after.worker["warm_note"] and str(module) in after.worker["warm_note"]
    assert {r.details["version"] for r in after.records} == {2}  # the edited code ran
    warm.process.wait(timeout=15)  # it retired itself
    assert not socket_path(sys.executable, "warm_code.target:Target").exists()


def test_worker_command_starts_stops_and_names_bad_targets(runtime: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["worker", "--target", "ref-gather", "--detach", "--idle-timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "warm worker for ref-gather:unfixed ready" in out
    sock = socket_path(sys.executable, "ref-gather")
    pid = int(sock.with_suffix(".pid").read_text())
    assert sock.exists() and alive(pid)
    assert cli_main(["worker", "--target", "ref-gather:fixed", "--detach"]) == 0
    assert "already runs" in capsys.readouterr().out
    assert cli_main(["worker", "--target", "ref-gather", "--stop"]) == 0
    deadline = time.monotonic() + 15
    while _alive_not_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive_not_zombie(pid) and not sock.exists()
    # a warm worker killed outright leaves its socket and pid file: runs go cold, and a new one starts
    assert cli_main(["worker", "--target", "ref-gather", "--detach"]) == 0
    capsys.readouterr()
    pid = int(sock.with_suffix(".pid").read_text())
    os.kill(pid, 9)
    while _alive_not_zombie(pid):
        time.sleep(0.05)
    assert sock.exists()
    cold = _run("ref-gather:fixed", n=2)
    assert cold.worker is not None and cold.worker["forked_from_warm"] is False
    assert "did not answer" in cold.worker["warm_note"]
    assert cli_main(["worker", "--target", "ref-gather", "--detach"]) == 0
    assert "ready" in capsys.readouterr().out
    assert cli_main(["worker", "--target", "ref-gather", "--stop"]) == 0
    assert cli_main(["worker", "--target", "no-such-target"]) == 2
    assert "no-such-target" in capsys.readouterr().err
    assert cli_main(["worker", "--target", "tests.isolation_targets:NoSuchClass", "--detach"]) == 2
    err = capsys.readouterr().err
    assert "did not start" in err and "NoSuchClass" in err


def _alive_not_zombie(pid: int) -> bool:
    """The CLI detached from the warm worker without reaping it: a zombie counts as ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


MILES = target_python("miles")


@pytest.mark.skipif(MILES is None, reason="the miles environment is not built (make targets)")
def test_a_miles_repro_forks_from_a_warm_worker_and_crashes_again(runtime: Path, tmp_path: Path) -> None:
    """The seed-000 repro on real miles: cold, then from a warm worker (its 7-10 s of imports paid once)."""
    assert MILES is not None
    base = dict(trace="agentic-500", plan=resolve_plan("seed-000"), target="miles", python=MILES,
                trajectories=["g00120-3"], watchdog_s=120.0)
    clock = time.monotonic()
    cold = asyncio.run(run(RunConfig(**base, warm=False)))  # type: ignore[arg-type]
    cold_s = time.monotonic() - clock
    assert [v.invariant for v in cold.violations] == ["batch_survival"]
    repro = write_repro(cold, tmp_path / "repro.toml")
    assert repro is not None
    clock = time.monotonic()
    warm = Warm("miles", tmp_path / "warm.log", MILES)  # as `rollout-bench worker --target miles`
    try:
        ready_s = time.monotonic() - clock
        clock = time.monotonic()
        again = asyncio.run(run(load_repro(repro, python=MILES, watchdog_s=120.0).config))
        again_s = time.monotonic() - clock
    finally:
        warm.stop()
    print(f"miles seed-000 on g00120-3: cold run {cold_s:.1f} s; warm worker ready in {ready_s:.1f} s; "
          f"repro forked from it {again_s:.1f} s")
    assert again.worker is not None and again.worker["forked_from_warm"] is True
    assert again.worker["versions"].get("miles-rl") == "0.0.2"
    assert [(v.invariant, v.trajectory) for v in again.violations] == [("batch_survival", "g00120-3")]
    assert again.batch_error is not None and again.batch_error.type == "InjectedFault"
    assert "generate_and_rm_group" in again.batch_error.traceback  # miles' own group gather, as in the cold run
    assert [(e.fault, e.trajectory, e.turn, e.attempt) for e in again.fault_events] == \
        [(e.fault, e.trajectory, e.turn, e.attempt) for e in cold.fault_events] != []


def test_a_slow_cold_start_suggests_a_warm_worker(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import _suggest_warm_worker

    _suggest_warm_worker({"spec": "miles:patched", "startup_s": 9.4, "forked_from_warm": False})
    assert "took 9.4 s to start and import miles; `rollout-bench worker --target miles --detach`" in \
        capsys.readouterr().err
    _suggest_warm_worker({"spec": "miles", "startup_s": 0.4, "forked_from_warm": True})
    _suggest_warm_worker({"spec": "ref-gather", "startup_s": 0.6, "forked_from_warm": False})
    assert capsys.readouterr().err == ""


def test_a_warm_worker_leaves_nothing_in_the_temp_folder(runtime: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Its default log lives beside its socket and goes with it (it used to be a `rollout-bench-warm-*` folder in the
    temp folder, one per start); a start that fails shows the log and removes it too."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert cli_main(["worker", "--target", "ref-gather", "--detach", "--idle-timeout", "60"]) == 0
    out = capsys.readouterr().out
    log = socket_path(sys.executable, "ref-gather").with_suffix(".log")
    assert f"log {log}" in out and log.exists()
    pid = int(log.with_suffix(".pid").read_text())
    assert cli_main(["worker", "--target", "ref-gather", "--stop"]) == 0
    deadline = time.monotonic() + 15
    while _alive_not_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(runtime.iterdir()) == [] and list(temp.iterdir()) == []
    assert cli_main(["worker", "--target", "tests.isolation_targets:NoSuchClass", "--detach"]) == 2
    assert "NoSuchClass" in capsys.readouterr().err
    assert list(runtime.iterdir()) == [] and list(temp.iterdir()) == []
