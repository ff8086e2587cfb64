"""After any end of a run or a sweep (normal, SIGINT, SIGTERM, SIGKILL of the bench) no process it started
survives for 5 s, not even one that left the worker's process group with `setsid`, and nothing is left in the
temp folder; SIGINT and SIGTERM write a report marked interrupted, a sweep marks itself interrupted; the
target's output is kept once, capped; a target's sys.exit is reported as SystemExit with its code.

Every wait is on a condition with a deadline (a pid file written, a process gone), never a guessed sleep."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import RunConfig, run
from bench.isolation.escapees import descendants
from tests.process_helpers import end, running, wait_until_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
TARGET = "tests.hardening_targets:Escapes"


def _wait_for(condition, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)
    return value


def _pids(pidfile: Path) -> list[int]:
    text = _wait_for(lambda: pidfile.exists() and pidfile.read_text(), 120.0, f"the target to write {pidfile}")
    return [int(pid) for pid in text.split()]


def _reap(pids: list[int]) -> list[int]:
    """The pids still running after 5 s; those are killed, so no test leaves them to the next one."""
    left = wait_until_gone(pids, 5.0)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _env(tmp: Path) -> dict[str, str]:
    """The bench's environment with a private temp folder, to see whether anything is left in it."""
    tmp.mkdir()
    return {**os.environ, "TMPDIR": str(tmp)}


def _start_run(tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], Path]:
    pidfile = tmp_path / "pids"
    command = [sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "8", "--time-scale", "0",
               "--target", TARGET, "--target-option", f"pidfile={pidfile}", "--target-option", "setsid=true",
               "--watchdog", "600", "--repro-reruns", "0", "--out", str(tmp_path / "report"), *options]
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_env(tmp_path / "tmp"))
    return cli, pidfile


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_sigint_writes_a_report_marked_interrupted_and_leaves_nothing(tmp_path: Path,
                                                                                  sig: signal.Signals) -> None:
    cli, pidfile = _start_run(tmp_path, "--target-option", "end=hang")
    try:
        pids = _pids(pidfile)  # worker, its child, and a child in a session of its own
        assert len(pids) == 3 and all(running(pid) for pid in pids)
        cli.send_signal(sig)
        out, err = cli.communicate(timeout=60)
    finally:
        end(cli)
    assert _reap(pids) == []
    assert cli.returncode == 128 + sig, err
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["interrupted"]["signal"] == sig.name
    assert summary["outcomes"]["lost"] == 8 and summary["violations"] == []  # cut off by the signal: not judged
    assert (tmp_path / "report" / "worker.log").exists() and (tmp_path / "report" / "run.toml").exists()
    junit = (tmp_path / "report" / "junit.xml").read_text()
    assert 'errors="1"' in junit and f"interrupted by {sig.name}" in junit  # CI does not read it as a pass
    assert "INTERRUPTED" in out and list((tmp_path / "tmp").iterdir()) == []


def test_sigkill_of_the_run_leaves_no_process_even_one_that_called_setsid(tmp_path: Path) -> None:
    cli, pidfile = _start_run(tmp_path, "--target-option", "end=hang")
    try:
        pids = _pids(pidfile)
        cli.kill()
        cli.communicate(timeout=30)
    finally:
        end(cli)
    assert _reap(pids) == []
    assert list((tmp_path / "tmp").iterdir()) == []  # no worker folder, no job file, no log


def test_a_normal_end_kills_a_setsid_child_and_keeps_the_targets_output_once_capped(tmp_path: Path) -> None:
    from bench.isolation.capped_log import HEAD_BYTES, TAIL_BYTES

    cli, pidfile = _start_run(tmp_path, "--target-option", "print_mb=3", "--plan", "none")
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 0, out + err
    assert _reap(_pids(pidfile)) == []
    log = (tmp_path / "report" / "worker.log").read_bytes()
    assert HEAD_BYTES + TAIL_BYTES < len(log) < HEAD_BYTES + TAIL_BYTES + 1000  # 3 MiB printed, 2 MiB kept
    assert b"bytes of the target's output left out here" in log
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["worker"]["log_bytes_left_out"] == 3 * 1024 * 1024 - HEAD_BYTES - TAIL_BYTES
    assert list((tmp_path / "tmp").iterdir()) == []  # kept once: in the report only


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_targets_sys_exit_is_reported_as_systemexit_with_its_code(isolation: str) -> None:
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=4, target="tests.hardening_targets:CallsSysExit",
                                       isolation=isolation)))
    assert result.batch_error is not None
    assert (result.batch_error.type, result.batch_error.message) == ("SystemExit", "the rollout called sys.exit(3)")


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_stopped_sweep_ends_its_runs_workers_and_their_escaped_children(tmp_path: Path,
                                                                          sig: signal.Signals) -> None:
    out = tmp_path / "sweep"
    sweep = subprocess.Popen([sys.executable, "-m", "bench", "sweep", "--plan", "seed-000", "--target",
                              "tests.hardening_targets:EscapesAndHangs", "--rates", "0.01,0.02", "--seeds", "1",
                              "--n", "4", "--time-scale", "0", "--jobs", "2", "--watchdog", "600", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path / "tmp"))

    def everything_started() -> list[int] | None:
        """Both runs, each with its worker, the worker's child and the child that called setsid (`sleep 301`)."""
        found = descendants(sweep.pid)
        commands = [_command(pid) for pid in found]
        counts = [sum(marker in c for c in commands) for marker in ("bench.isolation.worker", "sleep 300", "sleep 301")]
        return found if counts == [2, 2, 2] else None

    try:
        pids = _wait_for(everything_started, 120.0, "both runs' workers and their children")
        sweep.send_signal(sig)
        sweep.communicate(timeout=60)
    finally:
        end(sweep)
    assert _reap(pids) == []
    if sig != signal.SIGKILL:
        assert sweep.returncode == 128 + sig
        summary = json.loads((out / "sweep.json").read_text())
        assert summary["status"] == "interrupted" and summary["outcomes"]["interrupted"] == 2, summary
    else:  # it could not mark itself: `report` tells a killed sweep from a running one
        shown = subprocess.run([sys.executable, "-m", "bench", "report", str(out)], capture_output=True, text=True)
        assert shown.returncode == 0 and "the sweep was killed outright" in shown.stderr, shown.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_inline_targets_children_end_with_the_run_even_one_that_called_setsid(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=4, target=TARGET, isolation="inline",
                                       target_options={"setsid": True, "pidfile": str(pidfile)})))
    children = _pids(pidfile)[1:]  # the first pid is this very process: the target ran inline
    assert len(children) == 2 and _reap(children) == []
    assert "ROLLOUT_BENCH_RUN_MARKER" not in os.environ  # the run's marker does not outlive it


def test_sigkill_of_a_run_forked_from_a_warm_worker_ends_its_escaped_child_too(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from bench.isolation.process import worker_env
    from bench.isolation.warm_client import RUNTIME_ENV, start_warm

    folder = Path(tempfile.mkdtemp(prefix="rbh-", dir="/tmp"))  # short: socket paths must fit 107 bytes
    monkeypatch.setenv(RUNTIME_ENV, str(folder))
    warm, ready = start_warm(sys.executable, TARGET, {}, 120.0, worker_env(sys.executable), tmp_path / "warm.log")
    try:
        cli, pidfile = _start_run(tmp_path, "--target-option", "end=hang")
        try:
            pids = _pids(pidfile)
            assert Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(ready["pid"])
            cli.kill()
            cli.communicate(timeout=30)
        finally:
            end(cli)
        assert _reap(pids) == []  # the forked worker, its child, and the child in a session of its own
        assert running(int(ready["pid"]))  # the warm worker serves on
    finally:
        warm.terminate()
        warm.wait(timeout=15)
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
