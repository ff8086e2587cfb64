"""The run's plots: outcomes by fault type, request timeline with fault events, throughput over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def outcomes_by_fault(trajectories: pd.DataFrame, path: Path) -> Path:
    frame = trajectories.assign(fault=trajectories["faults"].fillna("").replace("", "none").str.split(","))
    counts = frame.explode("fault").groupby(["fault", "outcome"]).size().unstack(fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    shares.index = [f"{name} (n={int(counts.loc[name].sum())})" for name in shares.index]
    fig, ax = plt.subplots(figsize=(8, 4))
    shares.plot.barh(stacked=True, ax=ax)
    ax.set_xlabel("share of trajectories hit by the fault")
    ax.set_title("Outcomes by fault type")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def request_timeline(requests: pd.DataFrame, faults: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(requests):
        start = float(requests["started"].min())
        ok = requests["status"].fillna(0).astype(int) < 400
        ax.scatter(requests.loc[ok, "started"] - start, requests.loc[ok].index, s=4, label="request")
        ax.scatter(requests.loc[~ok, "started"] - start, requests.loc[~ok].index, s=8, c="red", label="error status")
        if len(faults):
            for moment in faults["time"] - start:
                ax.axvline(moment, color="orange", alpha=0.3, linewidth=0.8)
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("request")
    ax.set_title("Requests, with fault events (orange)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def throughput(requests: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3))
    if len(requests):
        finished = requests["started"] + requests["latency_s"].fillna(0)
        seconds = (finished - float(requests["started"].min())).round(1)
        seconds.value_counts().sort_index().plot(ax=ax)
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests finished per 0.1 s")
    ax.set_title("Throughput over time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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


def write_plots(tables: dict[str, pd.DataFrame], folder: Path) -> list[Path]:
    return [outcomes_by_fault(tables["trajectories"], folder / "outcomes_by_fault.png"),
            request_timeline(tables["requests"], tables["faults"], folder / "request_timeline.png"),
            throughput(tables["requests"], folder / "throughput.png")]
