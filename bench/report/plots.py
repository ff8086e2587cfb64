"""The run's plots: outcomes by fault type, request timeline with fault events and the crash, throughput over time.

Every plot has a title, axis labels with units, and axes that start at zero: people compare these by eye across
nights, and a shifted origin hides a halved throughput.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bench.records.atomic_write import atomic_path  # noqa: E402

BINS = 60  # throughput bins over the run, whatever its length


def outcomes_by_fault(trajectories: pd.DataFrame) -> Figure:
    frame = trajectories.assign(fault=trajectories["faults"].fillna("").replace("", "none").str.split(","))
    counts = frame.explode("fault").groupby(["fault", "outcome"]).size().unstack(fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    shares.index = [f"{name} (n={int(counts.loc[name].sum())})" for name in shares.index]
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(shares):
        shares.plot.barh(stacked=True, ax=ax)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the trajectories hit by the fault type (0 to 1)")
    ax.set_ylabel("fault type (trajectories hit)")
    ax.set_title("Outcomes by fault type")
    return fig


def crash_moment(summary: dict[str, Any] | None, requests: pd.DataFrame) -> tuple[float, str] | None:
    """When and how the batch went down, as far as the report knows: the fault that reached the raising
    trajectory, else that trajectory's last request; None when no batch error was recorded."""
    error = (summary or {}).get("batch_error")
    if not isinstance(error, dict):
        return None
    raised_by = error.get("raised_by") or "?"
    label = f"batch error: {error.get('type', 'error')} raised by {raised_by}"
    reached = error.get("fault_reached")
    if isinstance(reached, dict) and isinstance(reached.get("time"), (int, float)):
        return float(reached["time"]), f"{label} after {reached.get('fault')}"
    own = requests[requests["trajectory"] == raised_by] if "trajectory" in requests else requests.iloc[0:0]
    if len(own):
        return float((own["started"] + own["latency_s"].fillna(0)).max()), label
    return None


def request_timeline(requests: pd.DataFrame, faults: pd.DataFrame, summary: dict[str, Any] | None = None) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(requests):
        start = float(requests["started"].min())
        ok = requests["status"].fillna(0).astype(int) < 400
        order = np.arange(len(requests))
        ax.scatter(requests.loc[ok, "started"] - start, order[ok.to_numpy()], s=4, label="request (status < 400)")
        ax.scatter(requests.loc[~ok, "started"] - start, order[~ok.to_numpy()], s=8, c="red",
                   label="request (error status or none)")
        for index, moment in enumerate(faults["time"] - start if len(faults) else []):
            ax.axvline(moment, color="orange", alpha=0.3, linewidth=0.8,
                       label=f"fault event ({len(faults)})" if index == 0 else None)
        crash = crash_moment(summary, requests)
        if crash is not None:
            ax.axvline(crash[0] - start, color="black", linestyle="--", linewidth=1.5, label=crash[1])
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("request (in order of arrival)")
    ax.set_title("Requests over the run, with fault events and the crash")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=7)
    return fig


def throughput(requests: pd.DataFrame) -> Figure:
    """Requests finished per second in equal bins over the run, empty bins included (a stall shows as zero, not
    as a line drawn across it)."""
    fig, ax = plt.subplots(figsize=(8, 3))
    width = 0.0
    if len(requests):
        start = float(requests["started"].min())
        finished = (requests["started"] + requests["latency_s"].fillna(0) - start).to_numpy()
        edges = np.linspace(0, max(float(finished.max()), 1e-3), BINS + 1)
        width = float(edges[1] - edges[0])
        counts, _ = np.histogram(finished, bins=edges)
        ax.stairs(counts / width, edges)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("requests finished per s" + (f" ({width:.3g} s bins)" if width else ""))
    ax.set_title("Throughput over time")
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    try:
        with atomic_path(path) as temporary:
            fig.savefig(temporary, dpi=100, format="png")
    finally:
        plt.close(fig)
    return path


def warm_up() -> None:
    """Draw one throwaway figure: matplotlib loads its fonts and renderer on the first draw (~0.5 s), which
    `rollout-bench run` does while its worker process is still importing the target, not after the run."""
    import io

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.set_title("warm-up")
    fig.tight_layout()
    fig.savefig(io.BytesIO(), dpi=100)
    plt.close(fig)


def write_plots(tables: dict[str, pd.DataFrame], folder: Path, summary: dict[str, Any] | None = None) -> list[Path]:
    return [_save(outcomes_by_fault(tables["trajectories"]), folder / "outcomes_by_fault.png"),
            _save(request_timeline(tables["requests"], tables["faults"], summary), folder / "request_timeline.png"),
            _save(throughput(tables["requests"]), folder / "throughput.png")]
