"""The command line as a user meets it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.cli import main


def test_inspect_writes_tidy_tables(small_agentic: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report"
    assert main(["inspect", str(small_agentic), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out.resolve()}" in printed and "trajectories / groups" in printed
    trajectories = pd.read_csv(out / "trajectories.csv")
    turns = pd.read_csv(out / "turns.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(trajectories) == summary["trajectories"] == 8
    assert len(turns) == summary["turns"] == trajectories["turns"].sum()
    assert set(turns["trajectory"]) == set(trajectories["trajectory"])
    assert summary["output_tokens"] == turns["completion_tokens"].sum()


def test_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "inspect", str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "no such file, and not a shipped trace name (agentic-500, retool-64, rlvr-500)" in run.stderr


def test_tokenizer_and_traces_commands() -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "tokenizer"], capture_output=True, text=True, check=True)
    assert (Path(run.stdout.strip()) / "tokenizer.json").is_file()
    listing = subprocess.run([sys.executable, "-m", "bench", "traces"], capture_output=True, text=True, check=True)
    assert "agentic-500" in listing.stdout and "rlvr-500" in listing.stdout


def test_run_target_flags_reach_the_worker_or_fail_clearly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--python and --target-option are checked before anything runs, and name what is wrong."""
    assert main(["run", "--target", "ref-gather:fixed", "--n", "4", "--target-option", "no-equals-sign",
                 "--out", str(tmp_path / "a")]) == 2
    assert "--target-option 'no-equals-sign': expected KEY=VALUE" in capsys.readouterr().err
    assert main(["run", "--target", "ref-gather:fixed", "--n", "4", "--python", str(tmp_path / "no-python"),
                 "--out", str(tmp_path / "b")]) == 2
    assert f"cannot start the worker interpreter {tmp_path / 'no-python'}" in capsys.readouterr().err
    # a JSON value arrives typed: the scheduler's safety valve as an int
    assert main(["run", "--target", "ref-scheduler:unfixed", "--plan", "seed-003", "--n", "8", "--time-scale", "0",
                 "--target-option", "max_reschedules=2", "--out", str(tmp_path / "c")]) in (0, 1)
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    # the worker's scheduler obeyed it: 2 groups + 2 replacement groups of 4 during the outage, no more
    assert len(pd.read_csv(tmp_path / "c" / "requests.csv")) == 4 * (2 + 2)
    assert summary["isolation"] == "process" and summary["worker"]["python"] == sys.executable
    repro = (tmp_path / "c" / "repro.toml").read_text()  # seed-003's 429 rule never fires on 8: vacuity
    assert 'target_options = {"max_reschedules" = 2}' in repro


def test_faults_lists_every_fault_type_and_the_readme_counts_them(capsys) -> None:  # type: ignore[no-untyped-def]
    """`rollout-bench faults` prints each type of the catalogue; the README's count of them is the catalogue's."""
    import re

    from faults import FAULTS, fault_class

    fault_class("abort")  # registers the catalogue
    assert main(["faults"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()
              and not line.startswith("shipped plans")]
    assert listed == sorted(FAULTS)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    counted = re.search(r"`rollout-bench faults` lists the (\d+) fault types", readme)
    assert counted is not None and int(counted.group(1)) == len(FAULTS), counted


def test_an_n_beyond_the_trace_runs_every_trajectory_and_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["run", "--target", "ref-gather:fixed", "--trace", "retool-64", "--n", "1000", "--plan", "none",
                 "--time-scale", "0", "--in-process", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["trajectories"] == 64
    assert "run: --n 1000, but the trace has 64 trajectories: all of them ran" in capsys.readouterr().err


def test_inspect_says_a_trace_without_tool_outputs_has_none(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["inspect", "rlvr-500", "--out", str(tmp_path / "rlvr")]) == 0
    assert "tool output tokens (p50 / p99 / max)  none in this trace" in capsys.readouterr().out
