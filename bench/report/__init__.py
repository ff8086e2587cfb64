"""Run reports: tidy tables, `summary.json`, PNG plots and JUnit XML in one folder.

`write_report(result, folder)` writes them; `load(folder)` reads them back as DataFrames for
notebooks; `rollout-bench report DIR` re-renders the plots and prints the summary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from bench.orchestration.runner import RunResult
from bench.records.atomic_write import atomic_path, write_text
from bench.steps.report import write_step_report

from .junit import write_junit
from .plots import write_plots
from .served import SERVED_FILE, ServedArrays
from .summary import format_summary, summarize
from .tables import TABLES, frames, read_json, read_tables, write_tables


def write_report(result: RunResult, folder: str | Path, junit: str | Path | None = None) -> dict[str, Any]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = frames(result)
    write_tables(tables, folder)
    if result.served is not None:
        result.served.write(folder / SERVED_FILE)
    summary = summarize(result, tables)
    write_text(folder / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_plots(tables, folder, summary)
    write_step_report(summary, folder)  # a multi-step run's steps.csv and steps.png
    write_junit(result, Path(junit) if junit else folder / "junit.xml", summary.get("provenance"))
    _keep_worker_log(result, folder)
    return summary


def add_to_summary(folder: str | Path, key: str, value: Any) -> None:
    """Add what was learnt after the report was written (the verified repros) to its `summary.json`."""
    path = Path(folder) / "summary.json"
    summary = read_json(path)
    summary[key] = value
    write_text(path, json.dumps(summary, indent=2, default=str) + "\n")


def _keep_worker_log(result: RunResult, folder: Path) -> None:
    """The target's own output (framework logs, tracebacks) belongs with the run's evidence."""
    if result.worker_log is not None:
        write_text(folder / "worker.log", result.worker_log)
        return
    log = Path(result.worker["log"]) if result.worker and result.worker.get("log") else None
    if log is not None and log.exists() and log.resolve() != (folder / "worker.log").resolve():
        with atomic_path(folder / "worker.log") as temporary:
            shutil.copyfile(log, temporary)


def load(folder: str | Path) -> dict[str, Any]:
    """The run's tables (`trajectories`, `requests`, `faults`) as DataFrames, plus `summary` and `served` (the
    tokens and logprobs each request was served, `ServedArrays`), and for a multi-step run `steps` (one row per
    step); for a sweep's folder, what `load_sweep` returns."""
    folder = Path(folder)
    if (folder / "sweep.csv").exists() or (folder / "sweep.parquet").exists():
        return load_sweep(folder)
    out: dict[str, Any] = dict(read_tables(folder))
    out["summary"] = read_json(folder / "summary.json")
    rows, expected = len(out["trajectories"]), out["summary"].get("trajectories")
    if isinstance(expected, int) and rows != expected:
        raise ValueError(f"{folder}: the trajectories table has {rows} rows, summary.json says {expected}: "
                         "the table was cut off or edited")
    if (folder / SERVED_FILE).exists():
        out["served"] = ServedArrays.load(folder / SERVED_FILE)
    steps = out["summary"].get("steps")
    if steps and steps.get("rows"):  # a multi-step run: its per-step table (steps.csv has the same rows)
        out["steps"] = pd.DataFrame(steps["rows"])
    return out


def load_sweep(folder: str | Path) -> dict[str, Any]:
    """A sweep's folder: `runs` (one row per run; `report` is the run's folder, for `load`), `faults`
    (per run and fault type) and `summary` (the sweep's grid, options and outcome counts)."""
    from bench.sweep.table import load_sweep as read_sweep  # here: the sweep's tables import this package

    return read_sweep(folder)


def rerender(folder: str | Path) -> dict[str, Any]:
    """Redraw a report folder's plots from its tables; returns its summary."""
    loaded = load(folder)
    write_plots({k: loaded[k] for k in TABLES if k in loaded}, Path(folder), loaded["summary"])
    write_step_report(loaded["summary"], Path(folder))  # a multi-step run's steps.csv and steps.png
    return loaded["summary"]  # type: ignore[no-any-return]


__all__ = ["ServedArrays", "add_to_summary", "format_summary", "load", "load_sweep", "rerender", "write_report"]
