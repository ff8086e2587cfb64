"""The run's tidy tables: one row per trajectory, per request, per fault event."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from bench.invariants.fault_reach import NOT_REACHED
from bench.orchestration.runner import RunResult
from bench.records.atomic_write import atomic_path
from bench.records.request_log import COLUMNS as REQUEST_COLUMNS
from faults.log import COLUMNS as FAULT_COLUMNS

from .status import status_verdicts

TABLES = ("trajectories", "requests", "faults")


def _names_by_trajectory(faults: pd.DataFrame) -> dict[str, str]:
    if faults.empty:
        return {}
    return faults.groupby("trajectory")["fault"].agg(lambda s: ",".join(sorted(set(s)))).to_dict()


def frames(result: RunResult) -> dict[str, pd.DataFrame]:
    """`faults` in the trajectories table names only the faults that reached the code (`bench.invariants.fault_reach`):
    drop rates by fault type are computed from it; `faults_not_reached` names the others."""
    faults = pd.DataFrame([asdict(e) for e in result.fault_events], columns=FAULT_COLUMNS)
    reached = ~faults["reach"].isin(NOT_REACHED)
    hit, missed = _names_by_trajectory(faults[reached]), _names_by_trajectory(faults[~reached])
    honesty = status_verdicts(result.records, result.requests, result.context_length)
    rows = []
    for record in result.records:
        row = record.to_row()
        row["faults"] = hit.get(record.trajectory, "")
        row["faults_not_reached"] = missed.get(record.trajectory, "")
        row["provenance"] = result.provenance.get(record.trajectory)  # `bench.invariants.provenance`
        row["status_honest"] = honesty.get(record.trajectory)  # `bench.report.status`: cut yet COMPLETED?
        rows.append(row)
    requests = pd.DataFrame([asdict(r) for r in result.requests], columns=REQUEST_COLUMNS)
    return {"trajectories": pd.DataFrame(rows), "requests": requests, "faults": faults}


def parquet_available() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def write_tables(tables: dict[str, pd.DataFrame], folder: Path) -> list[Path]:
    """CSV by default; Parquet when pyarrow is installed."""
    written = []
    for name, frame in tables.items():
        path = folder / (f"{name}.parquet" if parquet_available() else f"{name}.csv")
        with atomic_path(path) as temporary:  # a full disk leaves no cut-off table, and names the file
            if path.suffix == ".parquet":
                frame.to_parquet(temporary, index=False)
            else:
                frame.to_csv(temporary, index=False)
        written.append(path)
    return written


def _check_complete(csv: Path) -> None:
    """A CSV the bench wrote ends with a newline; one that does not was cut off (a full disk, a killed copy),
    and pandas would read its last row with the missing fields empty, silently."""
    with csv.open("rb") as file:
        file.seek(0, 2)
        size = file.tell()
        if size == 0:
            raise ValueError(f"{csv}: empty: the table was cut off or never written")
        file.seek(size - 1)
        if file.read(1) != b"\n":
            raise ValueError(f"{csv}: truncated: its last line is incomplete (the file was cut off)")


def read_json(path: Path) -> Any:
    """A report's JSON file (`summary.json`, a sweep's `sweep.json`); one cut off or edited by hand names itself,
    where json's own error ("Expecting value: line 69 column 17") says neither which file nor what is wrong."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        cut_off = not error.doc.rstrip().endswith(("}", "]"))  # the bench writes whole documents only
        raise ValueError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}"
                         + ("; it ends early (the file was cut off)" if cut_off else "")) from None


def read_tables(folder: Path) -> dict[str, pd.DataFrame]:
    out = {}
    for name in TABLES:
        parquet, csv = folder / f"{name}.parquet", folder / f"{name}.csv"
        if parquet.exists():
            out[name] = pd.read_parquet(parquet)
        elif csv.exists():
            _check_complete(csv)
            out[name] = pd.read_csv(csv)
            if name == "trajectories":  # a run without fault events writes an empty column, read back as floats
                out[name]["faults"] = out[name]["faults"].astype(object).fillna("")
        else:
            raise FileNotFoundError(f"{folder}: no {name}.csv or {name}.parquet: not a run report folder")
    return out
