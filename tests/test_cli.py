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
    assert "no such file, and not a shipped trace name (agentic-500, rlvr-500)" in run.stderr


def test_tokenizer_and_traces_commands() -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "tokenizer"], capture_output=True, text=True, check=True)
    assert (Path(run.stdout.strip()) / "tokenizer.json").is_file()
    listing = subprocess.run([sys.executable, "-m", "bench", "traces"], capture_output=True, text=True, check=True)
    assert "agentic-500" in listing.stdout and "rlvr-500" in listing.stdout
