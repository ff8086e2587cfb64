"""`rollout-bench sweep --resume DIR`: finish a sweep whose driver died, running only what is missing.

A sweep records in `sweep.json` (key `grid`) everything that decides what its runs do: each plan as the
TOML it was swept from, targets, exact rates, seeds, shard and the run options. Every finished run is
appended, as its table rows, to `sweep_rows.jsonl` (one JSON line, flushed and synced, before the tables
are rewritten), so a sweep killed at any instant loses at most the runs that were in flight. Resuming
rebuilds the grid from the record, keeps the rows of finished runs and runs the rest. Runs that ended
`interrupted` (their sweep was stopped) or `lost` (their node died on every attempt) are run again: those
outcomes say nothing about the target. Grid options or run options given again on the command line must
equal the record's; a difference is refused, naming the option, because a table mixing two grids would
compare runs that did not share their inputs. `--jobs` and the executor (`--ray`) may change: they decide
where and how many at once, not what a run does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from faults import Plan
from faults.plan import parse_plan, plan_to_toml

from .grid import Shard, SweepError, parse_shard

ROWS_FILE = "sweep_rows.jsonl"
RERUN_OUTCOMES = ("interrupted", "lost")  # not a finding about the target: a resumed sweep runs these again
# SweepOptions fields a resumed sweep may change (where and how many at once, not what a run does)
FREE_OPTIONS = ("jobs",)


def grid_record(plans: list[Plan], targets: list[str], rates: list[Fraction], seeds: list[int], shard: Shard | None,
                options: dict[str, Any]) -> dict[str, Any]:
    """What `sweep.json` keeps so the same grid can be rebuilt exactly (rates as fractions, plans as TOML)."""
    return {"plans": [plan_to_toml(plan) for plan in plans], "plan_names": [plan.name for plan in plans],
            "targets": list(targets), "rates": [str(rate) for rate in rates], "seeds": list(seeds),
            "shard": None if shard is None else str(shard),
            "options": {key: value for key, value in options.items() if key not in FREE_OPTIONS}}


def read_record(out: Path) -> dict[str, Any]:
    """The `grid` record of the sweep in `out`; a clear error when `out` holds no resumable sweep."""
    path = out / "sweep.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SweepError(f"--resume {out}: no sweep.json there: not a sweep folder") from None
    except (OSError, ValueError) as error:
        raise SweepError(f"--resume {out}: sweep.json cannot be read ({error})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("grid"), dict):
        raise SweepError(f"--resume {out}: sweep.json has no `grid` record (a sweep from a bench without "
                         "--resume): it cannot be resumed")
    return summary["grid"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class ResumedGrid:
    plans: list[Plan]
    targets: list[str]
    rates: list[Fraction]
    seeds: list[int]
    shard: Shard | None


def resumed_grid(out: Path, record: dict[str, Any], plans: list[Plan] | None, targets: list[str] | None,
                 rates: list[Fraction] | None, seeds: list[int] | None,
                 shard: Shard | None) -> tuple[ResumedGrid, list[str]]:
    """The recorded grid, and how the parts given again (not None) differ from it (see `refuse`)."""
    stored_plans = [parse_plan(text, f"{out / 'sweep.json'} (plan {name})")
                    for text, name in zip(record["plans"], record["plan_names"], strict=True)]
    stored = ResumedGrid(stored_plans, record["targets"], [Fraction(r) for r in record["rates"]], record["seeds"],
                         None if record["shard"] is None else parse_shard(record["shard"]))
    differences = []
    if plans is not None and [plan_to_toml(p) for p in plans] != record["plans"]:
        names = [p.name for p in plans]
        why = "" if names != record["plan_names"] else " (same names, but their rules or seeds differ)"
        differences.append(f"--plan: the sweep ran {','.join(record['plan_names'])}, this command gives "
                           f"{','.join(names)}{why}")
    for option, given, kept in (("--target", targets, stored.targets), ("--rates", rates, stored.rates),
                                ("--seeds", seeds, stored.seeds)):
        if given is not None and list(given) != list(kept):
            differences.append(f"{option}: the sweep ran {_listed(kept)}, this command gives {_listed(given)}")
    if shard is not None and shard != stored.shard:
        differences.append(f"--shard: the sweep ran {stored.shard or 'the whole grid'}, this command gives {shard}")
    return stored, differences


def resumed_options(out: Path, record: dict[str, Any], given: dict[str, Any], option_names: dict[str, str],
                    free: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The recorded run options (SweepOptions fields), with `free` ones (jobs) from this command, and the
    options given again with another value, named as on the command line (`option_names`)."""
    stored = dict(record["options"])
    differences = [f"{option_names.get(key, key)}: the sweep ran {_shown(stored.get(key))}, this command gives "
                   f"{_shown(value)}" for key, value in given.items()
                   if key not in FREE_OPTIONS and _normal(value) != _normal(stored.get(key))]
    return {**stored, **free}, differences


def refuse(out: Path, differences: list[str]) -> None:
    if differences:
        raise SweepError(f"--resume {out}: this command's grid or options differ from the sweep's (its sweep.json); "
                         "resume with the same ones, or start a new sweep in another folder:\n  "
                         + "\n  ".join(differences))


def _normal(value: Any) -> Any:
    """Tuples and lists compare alike (sweep.json has lists); numbers as numbers."""
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return value


def _listed(values: Any) -> str:
    return ",".join(str(value) for value in values)


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return repr(" ".join(map(str, value))) if value else "none"
    return "the default" if value is None else str(value)


class RowLedger:
    """`sweep_rows.jsonl`: every finished run's rows, appended as it finishes; the resumable record."""

    def __init__(self, out: Path) -> None:
        self.path = out / ROWS_FILE

    def finished(self) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Rows by grid index, the last line for an index winning; a torn last line (killed mid-write) is
        ignored (its run is run again)."""
        rows: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return rows
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except ValueError:
                if number == len(lines):
                    continue
                raise SweepError(f"{self.path}:{number}: not a JSON line; the ledger is damaged") from None
            rows[entry["index"]] = (entry["row"], entry["faults"])
        return rows

    def append(self, index: int, row: dict[str, Any], faults: list[dict[str, Any]]) -> None:
        line = json.dumps({"index": index, "row": row, "faults": faults}, allow_nan=True) + "\n"
        with self.path.open("a", encoding="utf-8") as ledger:
            ledger.write(line)
            ledger.flush()
            os.fsync(ledger.fileno())


