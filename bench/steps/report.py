"""A multi-step run in its report: the `steps` block of `summary.json`, `steps.csv` (one row per step), the
`steps.png` plot, and the terminal's per-step lines. Only reports and the command line import this (pandas,
matplotlib): the worker never does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OUTCOME_COLUMNS = ("completed", "truncated", "aborted", "dropped", "failed", "lost")
RESOURCE_COLUMNS = ("tasks", "threads", "sockets", "fds", "children")


def write_step_report(summary: dict[str, Any], folder: Path) -> list[Path]:
    """`steps.csv` and `steps.png` for a multi-step run (nothing for a one-step run)."""
    steps = summary.get("steps")
    if not steps:
        return []
    import pandas as pd

    from bench.records.atomic_write import atomic_path
    from bench.report.plots import _save

    rows = pd.DataFrame(steps["rows"])
    with atomic_path(folder / "steps.csv") as temporary:  # whole or not at all, as every report file (steps.png too)
        rows.to_csv(temporary, index=False)
    return [_save(step_plot(rows, steps), folder / "steps.png")]


def step_plot(rows: Any, steps: dict[str, Any]) -> Any:
    """Per step: samples by outcome (stacked bars) with the drop rate, throughput, and what the worker held."""
    import matplotlib.pyplot as plt

    fig, (outcomes, speed, held) = plt.subplots(1, 3, figsize=(13, 3.4))
    x = rows["step"].to_numpy()
    bottom = [0] * len(rows)
    for outcome in OUTCOME_COLUMNS:
        counts = rows[f"n_{outcome}"].to_numpy()
        if counts.sum():
            outcomes.bar(x, counts, bottom=bottom, label=outcome)
            bottom = [b + c for b, c in zip(bottom, counts)]
    outcomes.set_xlabel("step")
    outcomes.set_ylabel("samples")
    outcomes.set_ylim(0, max([*bottom, 1]) * 1.2)  # room for the drop rates above the bars
    outcomes.set_title("Samples by outcome (drop rate above)")
    for step, total, rate in zip(x, bottom, rows["drop_rate"]):
        if rate is not None and rate == rate:
            outcomes.annotate(f"{rate:.0%}", (step, total), ha="center", va="bottom", fontsize=8)
    outcomes.legend(fontsize=7)
    speed.plot(x, rows["samples_per_s"].astype(float), marker="o")
    speed.set_xlabel("step")
    speed.set_ylabel("finished samples per s")
    speed.set_ylim(bottom=0)
    speed.set_title("Throughput per step")
    for column in RESOURCE_COLUMNS:
        if column in rows and rows[column].notna().any():
            held.plot(x, rows[column].astype(float), marker="o", label=column)
    held.set_xlabel("step")
    held.set_ylabel("count after the step")
    held.set_ylim(bottom=0)
    held.set_title("What the worker held after each step")
    if held.get_legend_handles_labels()[0]:
        held.legend(fontsize=7)
    for axes in (outcomes, speed, held):
        axes.set_xticks(x)
    first = steps.get("first_violation")
    if first and first.get("step") is not None:
        for axes in (outcomes, speed, held):
            axes.axvline(first["step"], color="red", linestyle="--", linewidth=1)
        fig.suptitle(f"first violation at step {first['step']}: {first['invariant']}", color="red", fontsize=9)
    return fig


def step_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The terminal's lines: how many steps ran, one line per step, the first violation's step."""
    steps = summary.get("steps")
    if not steps:
        return []
    lines = [("steps", f"{steps['ran']} of {steps['steps']} ran (on step failure: {steps['on_step_failure']})")]
    for row in steps["rows"]:
        outcomes = ", ".join(f"{o} {row[f'n_{o}']}" for o in OUTCOME_COLUMNS if row[f"n_{o}"])
        held = ", ".join(f"{key} {row[key]}" for key in RESOURCE_COLUMNS if row.get(key) is not None)
        rss = f", rss {row['rss_mb']} MiB" if row.get("rss_mb") is not None else ""
        by_adapter = row.get("published_by") == "adapter"
        trainer = row.get("trainer_version")
        weights = f"v{row['weight_version']}" + (f" (held by {', '.join(row['weights_held_by'])})"
                                                 if row["weights_held_by"] else "") + (
            "" if not by_adapter else " by the adapter" if trainer in (None, row["weight_version"])
            else f" by the adapter, whose trainer published v{trainer}")
        lag = f", lag {row['max_lag']}" if row.get("max_lag") else ""
        lines.append((f"  step {row['step']}", f"{weights}{lag}: {row['samples']} samples ({outcomes or 'none'}), "
                      f"{row['requests']} requests" + (f" ({row['late_requests']} after it returned)"
                                                        if row["late_requests"] else "")
                      + (f"; held {held}{rss}" if held else "")
                      + (f"; raised {row['error']}" if row["error"] else "")))
    fresh = steps.get("fresh_comparison")
    if fresh:  # `compare_fresh`: a later step against a fresh worker's run of it
        lines.append(("  fresh process", fresh["note"] if fresh.get("step") is None else
                      f"step {fresh['step']} rerun in a fresh worker: {fresh['differ']} of {fresh['trajectories']} "
                      f"trajectories differ"))
    first = steps.get("first_violation")
    if first:
        at = f"step {first['step']}" if first.get("step") is not None else "no step"
        lines.append(("  first violation", f"{at}: {first['invariant']}: {first['message']}"))
    return lines
