"""A sweep killed outright (SIGKILL) cannot mark its sweep.json; whoever reads it tells a dead sweep from a live one:
`report`, `bench.report.load` (the notebook) and the next sweep pointed at the same folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.report import load_sweep
from bench.sweep.grid import SweepError
from bench.sweep.liveness import effective_status, process_gone
from bench.sweep.sweeper import SweepOptions, run_sweep
from bench.sweep.table import write_sweep_tables
from faults import resolve_plan


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _sweep_folder(folder: Path, pid: int, started: float) -> Path:
    folder.mkdir()
    write_sweep_tables([], [], folder)
    (folder / "sweep.json").write_text(json.dumps({"status": "running", "pid": pid, "host": os.uname().nodename,
                                                   "started": started, "runs": 4, "finished_runs": 1}))
    return folder


def test_a_running_sweep_whose_process_is_gone_reads_as_killed(tmp_path: Path) -> None:
    folder = _sweep_folder(tmp_path / "sweep", _dead_pid(), time.time())
    summary = load_sweep(folder)["summary"]
    assert summary["status"] == "killed" and summary["recorded_status"] == "running"
    assert "killed outright; 1 of 4 runs finished" in summary["status_note"]
    shown = subprocess.run([sys.executable, "-m", "bench", "report", str(folder)], capture_output=True, text=True)
    assert shown.returncode == 0 and "status killed" in shown.stderr and "pid" in shown.stderr, shown.stderr


def test_a_live_sweep_still_reads_as_running(tmp_path: Path) -> None:
    folder = _sweep_folder(tmp_path / "sweep", os.getpid(), time.time())  # this process: started before `started`
    assert load_sweep(folder)["summary"]["status"] == "running"


def test_a_reused_pid_is_not_the_sweep(tmp_path: Path) -> None:
    """The pid lives, but its process started long after the sweep did: another process took the number."""
    summary = {"status": "running", "pid": os.getpid(), "host": os.uname().nodename, "started": 1_000_000.0}
    assert process_gone(summary) is True and effective_status(summary) == "killed"


def test_another_host_s_sweep_is_not_judged(tmp_path: Path) -> None:
    summary = {"status": "running", "pid": _dead_pid(), "host": "not-" + os.uname().nodename, "started": time.time()}
    assert process_gone(summary) is None and effective_status(summary) == "running"


def test_the_next_sweep_into_the_folder_says_what_is_there(tmp_path: Path) -> None:
    killed = _sweep_folder(tmp_path / "killed", _dead_pid(), time.time())
    with pytest.raises(SweepError, match=r"holds a sweep killed outright \(pid \d+ is gone, 1 of 4 runs finished\)"):
        run_sweep([resolve_plan("chaos")], ["ref-gather"], [], [0], killed, SweepOptions())
    live = _sweep_folder(tmp_path / "live", os.getpid(), time.time())
    with pytest.raises(SweepError, match=rf"a sweep \(pid {os.getpid()}\) is still running into it"):
        run_sweep([resolve_plan("chaos")], ["ref-gather"], [], [0], live, SweepOptions())


def test_the_stat_reader_counts_fields_past_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    """`/proc/PID/stat` as every liveness and CPU check reads it (`bench.isolation.proc_stat`): the command name may
    hold `) ` itself, so a split from the first `)` would read the wrong fields."""
    from bench.isolation.proc_stat import read_stat

    odd = tmp_path / "a) b (c"  # the command name the kernel shows is the executable's
    odd.symlink_to(sys.executable)
    before = time.time()
    child = subprocess.Popen([str(odd), "-c", "import time; sum(range(10**7)); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while (stat := read_stat(child.pid)) is not None and stat.cpu_s < 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stat is not None and stat.ppid == os.getpid() and not stat.ended and stat.cpu_s >= 0.05
        assert before - 2 <= stat.started <= time.time() + 2
        child.kill()
        deadline = time.monotonic() + 10
        while not (gone := read_stat(child.pid)) or not gone.ended:  # a zombie until reaped
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()
    assert read_stat(child.pid) is None
