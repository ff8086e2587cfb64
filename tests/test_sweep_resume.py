"""`rollout-bench sweep --resume DIR` and `--shard K/N`: a sweep whose driver was SIGKILLed is finished by
running only its missing runs, each row once; a resume that would mix two grids is refused, naming the
difference; shards split a grid into parts that cover it exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from bench.cli import main
from bench.sweep.grid import build_grid, parse_shard
from faults import resolve_plan
from tests.test_sweep import ROOT, _processes_mentioning, sweep

GRID = ["--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.1,0.2", "--seeds", "1,2,3", "--n", "20",
        "--time-scale", "0"]


def test_shards_cover_the_grid_once_and_interleave() -> None:
    points = build_grid([resolve_plan("seed-000"), resolve_plan("chaos")], ["ref-gather:fixed"],
                        [Fraction(1, 10), Fraction(1, 5)], [1, 2, 3])
    parts = [parse_shard(f"{k}/4").select(points) for k in range(1, 5)]
    indexes = sorted(point.index for part in parts for point in part)
    assert indexes == list(range(len(points)))  # every point in exactly one shard
    assert [len(part) for part in parts] == [3, 3, 3, 3]
    assert {point.plan_name for point in parts[0]} == {"seed-000", "chaos"}  # not one plan per shard


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_bad_shard_is_refused_naming_it(text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", *GRID, "--shard", text, "--out", str(tmp_path / "out")])
    assert code == 2 and f"--shard {text!r}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_resume_needs_a_resumable_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--resume", str(tmp_path)]) == 2
    assert f"--resume {tmp_path}: no sweep.json there" in capsys.readouterr().err
    assert main(["sweep", "--plan", "seed-000", "--target", "ref-gather:fixed", "--out", str(tmp_path / "x")]) == 2
    assert "--rates, --seeds: required (or --resume DIR" in capsys.readouterr().err


def _ledger(out: Path) -> list[dict[str, object]]:
    path = out / "sweep_rows.jsonl"
    return [json.loads(line)["row"] for line in path.read_text().splitlines()] if path.exists() else []


def _start_sweep(out: Path) -> subprocess.Popen[bytes]:
    """The grid's sweep as a user starts it, one run at a time (so it can be caught mid-way)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "bench", "sweep", *GRID, "--jobs", "1", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to check the killed sweep's runs ended")
def test_a_sigkilled_sweep_resumes_running_only_what_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    driver = _start_sweep(out)
    try:
        deadline = time.monotonic() + 300
        while len(_ledger(out)) < 2:  # two runs finished, the third under way
            assert driver.poll() is None and time.monotonic() < deadline, "the sweep ended or stalled before the kill"
            time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    before = {row["run"]: row for row in _ledger(out)}
    assert 2 <= len(before) < 6
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(out)):  # its run follows it through the stdin lifeline
        assert time.monotonic() < deadline, _processes_mentioning(str(out))
        time.sleep(0.2)
    assert json.loads((out / "sweep.json").read_text())["status"] == "running"  # it could not mark itself

    refused = sweep("--resume", str(out), "--seeds", "1,9", "--timeout", "5")
    assert refused.returncode == 2
    assert "--seeds: the sweep ran 1,2,3, this command gives 1,9" in refused.stderr
    assert "--timeout: the sweep ran 600.0, this command gives 5.0" in refused.stderr
    assert len(_ledger(out)) == len(before)  # nothing ran

    resumed = sweep("--resume", str(out), "--jobs", "2", *GRID)  # the same grid given again is fine
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {out}: {len(before)} of 6 runs finished, {6 - len(before)} to run" in resumed.stderr
    ledger = _ledger(out)
    assert len(ledger) == 6 and len({row["run"] for row in ledger}) == 6  # only the missing runs ran, once each
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 6 and table["run"].is_unique and set(table["outcome"]) == {"ok"}
    for run, row in before.items():  # finished runs were kept, not run again
        assert table.set_index("run").loc[run, "wall_s"] == row["wall_s"]
    # the fixed variant aborts exactly the trajectories the fault poisoned, in resumed runs as in the others
    assert (table["dropped"] == table["fault_events"]).all() and (table["dropped"] == table["n_aborted"]).all()
    for row in table.itertuples():  # the run the kill interrupted was run again from nothing: its report is whole
        assert json.loads((out / row.report / "summary.json").read_text())["seed"] == row.seed
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_with_finished_runs"] == len(before)
    assert summary["outcomes"]["ok"] == 6


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tells a live sweep by its pid in /proc")
def test_resume_refuses_a_sweep_whose_driver_still_runs(tmp_path: Path) -> None:
    """Two drivers on one folder would remove each other's runs in flight and run them twice."""
    out = tmp_path / "sweep"
    driver = _start_sweep(out)
    try:
        deadline = time.monotonic() + 300
        while not (out / "sweep.json").exists() or not (out / "runs").exists():
            assert driver.poll() is None and time.monotonic() < deadline, "the sweep ended before it was resumed"
            time.sleep(0.1)
        refused = sweep("--resume", str(out))
        assert driver.poll() is None, "the sweep ended before the resume could be refused: make the grid longer"
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert f"--resume {out}: its sweep is still running (pid {driver.pid})" in refused.stderr
    finally:
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=60)
    assert json.loads((out / "sweep.json").read_text())["status"] == "interrupted"
