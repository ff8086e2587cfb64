"""The sweep's tidy tables: one row per run (`sweep.csv`), one per run and fault type (`sweep_faults.csv`).

A row is built from what the run left behind: its exit status and, when it finished, its
report folder's `summary.json` and fault table. A run that crashed or timed out still gets
its row, with the outcome saying so and the report columns empty.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.records.atomic_write import atomic_path
from bench.report.tables import parquet_available, read_json, read_tables
from bench.records.sample import OUTCOMES

from .liveness import KILLED, effective_status, sweep_status_note

# no_requests: the run passed, but its target never sent the server a generation request, so it tested nothing
# (a sweep leaves out the vacuity invariant, which would say so only through a rule that never fired)
# interrupted: the run was stopped (the sweep was interrupted) and wrote the report of what it had gathered
# lost: on a Ray cluster, the node running it died on every attempt (no report; `--resume` runs it again)
RUN_OUTCOMES = ("ok", "violations", "no_requests", "interrupted", "crashed", "timeout", "lost")
TABLES = ("sweep", "sweep_faults")
# Every column of sweep.csv, in order (also the columns of an empty sweep).
COLUMNS = (
    "run", "plan", "target", "rate", "seed", "n", "trace", "outcome", "exit_code", "error",
    "trajectories", "drop_rate", "dropped", *(f"n_{name}" for name in OUTCOMES),
    "violations", "violated_invariants", "known_violations", "batch_error", "hang", "fault_events", "trajectories_hit",
    "trajectories_per_s", "requests_per_s", "output_tokens_per_s", "latency_p50_s", "latency_p90_s",
    "latency_p99_s", "retry_amplification", "duration_s", "steps_ran", "first_violation_step", "wall_s", "attempts",
    "nodes", "report",
)
# Counts and codes: nullable integers (a crashed run has none), not floats.
INT_COLUMNS = ("seed", "n", "exit_code", "trajectories", "dropped", *(f"n_{name}" for name in OUTCOMES), "violations",
               "known_violations", "fault_events", "trajectories_hit", "steps_ran", "first_violation_step", "attempts")
FAULT_COLUMNS = ("run", "plan", "target", "rate", "seed", "fault", "trajectories", "drop_rate")


@dataclass(frozen=True)
class Finished:
    """How one run's process ended, as the sweep saw it."""

    exit_code: int | None  # None: killed by the sweep's timeout
    timed_out: bool
    wall_s: float
    log_tail: str  # the last line of the run's output, for crashed rows


def outcome_of(finished: Finished, summary: dict[str, Any] | None) -> str:
    """ok / violations (the run's own verdict, exit 0 / 1 with a report); else timeout or crashed."""
    if finished.timed_out:
        return "timeout"
    if summary is not None and summary.get("interrupted"):
        return "interrupted"
    if summary is not None and finished.exit_code in (0, 1):
        if summary["violations"]:
            return "violations"
        return "no_requests" if _sent_nothing(summary) else "ok"
    return "crashed"


def _sent_nothing(summary: dict[str, Any]) -> bool:
    """The target was given trajectories and the server saw no generation request for any of them."""
    fidelity = summary.get("fidelity") or {}
    requests = fidelity.get("requests") if "requests" in fidelity else None
    if requests is None:  # a run against a live engine (no replay fidelity): its throughput says
        return bool(summary.get("trajectories")) and not (summary.get("throughput") or {}).get("requests_per_s")
    return bool(summary.get("trajectories")) and requests == 0


def _crash_cause(finished: Finished) -> str:
    code = finished.exit_code
    if code is not None and code < 0:
        try:
            cause = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            cause = f"killed by signal {-code}"
    else:
        cause = f"exit {code} without a report"
    return f"{cause}; last output: {finished.log_tail}" if finished.log_tail else cause


def _read_summary(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "summary.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def run_rows(base: dict[str, Any], folder: Path, finished: Finished) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's row for `sweep.csv` and its rows for `sweep_faults.csv`; `base` holds the grid columns."""
    summary = _read_summary(folder)
    outcome = outcome_of(finished, summary)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(base, outcome=outcome, exit_code=finished.exit_code, wall_s=round(finished.wall_s, 3),
               attempts=1, nodes=os.uname().nodename, report=f"runs/{folder.name}")
    if outcome == "timeout":
        row["error"] = "killed by the sweep's timeout"
    elif outcome == "crashed":
        row["error"] = _crash_cause(finished)
    elif outcome == "no_requests":
        row["error"] = "the target sent the server no generation request: the run tested nothing"
    elif outcome == "interrupted":
        row["error"] = f"interrupted by {summary['interrupted']['signal']}"  # type: ignore[index]
    if summary is None or outcome in ("crashed", "timeout"):
        return row, []
    throughput = summary["throughput"]
    row.update(
        trajectories=summary["trajectories"], drop_rate=summary["drop_rate"],
        dropped=sum(summary["outcomes"].get(name, 0) for name in ("aborted", "dropped", "failed", "lost")),
        **{f"n_{name}": summary["outcomes"].get(name, 0) for name in OUTCOMES},
        violations=len(summary["violations"]), violated_invariants=",".join(summary["violated_invariants"]),
        known_violations=len(summary.get("known_violations") or []),  # declared in --known: not failures
        batch_error=(summary["batch_error"] or {}).get("type"), hang=summary["hang"] is not None,
        trajectories_per_s=throughput["trajectories_per_s"], requests_per_s=throughput["requests_per_s"],
        output_tokens_per_s=throughput["output_tokens_per_s"],
        latency_p50_s=throughput["latency_s"]["p50"], latency_p90_s=throughput["latency_s"]["p90"],
        latency_p99_s=throughput["latency_s"]["p99"], retry_amplification=throughput["retry_amplification"],
        duration_s=summary["duration_s"],
    )
    steps = summary.get("steps")  # a multi-step run (`--steps K`): how many ran, the step first violated
    if steps:
        row["steps_ran"] = steps["ran"]
        row["first_violation_step"] = (steps.get("first_violation") or {}).get("step")
    try:
        tables = read_tables(folder)
        row["fault_events"] = len(tables["faults"])
        row["trajectories_hit"] = int(tables["trajectories"]["faults"].fillna("").astype(str).ne("").sum())
    except (OSError, ValueError):
        pass  # the summary is there but a table is not: keep the row, leave these empty
    faults = [{**{k: base[k] for k in ("run", "plan", "target", "rate", "seed")}, "fault": fault,
               "trajectories": stats["trajectories"], "drop_rate": stats["drop_rate"]}
              for fault, stats in summary["drop_rate_by_fault"].items()]
    return row, faults


def write_sweep_tables(rows: list[dict[str, Any]], fault_rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """`sweep.csv` and `sweep_faults.csv` always (a spreadsheet opens them); Parquet beside them with pyarrow."""
    frames = {"sweep": _typed(pd.DataFrame(rows, columns=list(COLUMNS))),
              "sweep_faults": _typed(pd.DataFrame(fault_rows, columns=list(FAULT_COLUMNS)))}
    written = []
    for name, frame in frames.items():  # each written whole, then renamed: a sweep killed meanwhile leaves the last
        _replace(folder / f"{name}.csv", lambda path: frame.to_csv(path, index=False))
        written.append(folder / f"{name}.csv")
        if parquet_available():
            _replace(folder / f"{name}.parquet", lambda path: frame.to_parquet(path, index=False))
            written.append(folder / f"{name}.parquet")
    return written


def _replace(path: Path, write: Any) -> None:
    """`write(temporary)`, then renamed into place (`atomic_path`): whole or not at all, a `WriteError` naming
    `path`."""
    with atomic_path(path) as temporary:
        write(temporary)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    for column in INT_COLUMNS:
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    if "hang" in frame:
        frame["hang"] = frame["hang"].astype("boolean")
    return frame


def is_sweep_folder(folder: str | Path) -> bool:
    return (Path(folder) / "sweep.csv").exists() or (Path(folder) / "sweep.parquet").exists()


def load_sweep(folder: str | Path) -> dict[str, Any]:
    """A sweep folder: `runs` (one row per run; `report` is the run's folder, absolute), `faults`
    (per run and fault type) and `summary` (the sweep's options and outcome counts)."""
    folder = Path(folder)
    if not is_sweep_folder(folder):
        raise FileNotFoundError(f"{folder}: no sweep.csv or sweep.parquet: not a sweep folder")
    frames = {}
    for name in TABLES:
        parquet, csv = folder / f"{name}.parquet", folder / f"{name}.csv"
        frames[name] = pd.read_parquet(parquet) if parquet.exists() else pd.read_csv(csv)
    runs, frames["sweep_faults"] = _typed(frames["sweep"]), _typed(frames["sweep_faults"])
    runs["report"] = [str((folder / str(path)).resolve()) for path in runs["report"]]
    summary_path = folder / "sweep.json"
    summary = read_json(summary_path) if summary_path.exists() else {}
    if summary.get("status") == "running" and effective_status(summary) == KILLED:  # SIGKILLed: it could not say
        summary = {**summary, "status": KILLED, "recorded_status": "running",
                   "status_note": sweep_status_note(summary)}
    return {"runs": runs, "faults": frames["sweep_faults"], "summary": summary}
