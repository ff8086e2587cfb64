"""Tidy tables and a summary of one trace (`rollout-bench inspect`).

One row per trajectory and one per turn, ready for pandas, plus `summary.json` with the
shape of the workload: turns, token counts, tool-output tail, latency percentiles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from bench.progress import progress

from . import TraceHeader, open_trace


def trace_tables(path: str | Path, *,
                 show_progress: bool = False) -> tuple[TraceHeader, pd.DataFrame, pd.DataFrame]:
    """(header, trajectories, turns) of the trace at `path`, read in one streaming pass."""
    trajectories: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    with open_trace(path) as reader:
        header = reader.header
        context_length = header.context_length
        for trajectory in progress(reader, total=None, desc="inspect", enabled=show_progress):
            for index, turn in enumerate(trajectory.turns):
                response = turn.response
                turns.append({
                    "trajectory": trajectory.id,
                    "turn": index,
                    "prompt_tokens": response.prompt_tokens,
                    "completion_tokens": response.completion_tokens,
                    "finish": (response.finish_reason or {}).get("type"),
                    "error_status": response.error.status if response.error else None,
                    "weight_version": response.weight_version,
                    "ttft_s": response.latency.ttft,
                    "latency_s": response.latency.total,
                    "tool_output_tokens": sum(o.tokens for o in turn.tool_outputs),
                    "context_share": response.prompt_tokens / context_length,
                })
            rows = turns[-len(trajectory.turns):]
            trajectories.append({
                "trajectory": trajectory.id,
                "group": trajectory.group_id,
                "turns": len(trajectory.turns),
                "prompt_tokens": len(trajectory.prompt.ids),
                "output_tokens": sum(r["completion_tokens"] for r in rows),
                "tool_output_tokens": sum(r["tool_output_tokens"] for r in rows),
                "peak_context_tokens": max(r["prompt_tokens"] + r["completion_tokens"] for r in rows),
                "latency_s": sum(r["latency_s"] for r in rows),
                "last_finish": rows[-1]["finish"],
                "error_status": rows[-1]["error_status"],
                # a recording knows no outcome: its last turn's ending stands for it
                "outcome": trajectory.metadata.get("outcome") or f"last turn {rows[-1]['finish'] or 'error'}",
                "reward": trajectory.reward,
            })
    return header, pd.DataFrame(trajectories), pd.DataFrame(turns)


def summarize(path: str | Path, header: TraceHeader, trajectories: pd.DataFrame,
              turns: pd.DataFrame) -> dict[str, Any]:
    tool = turns.loc[turns["tool_output_tokens"] > 0, "tool_output_tokens"]

    def quantiles(series: pd.Series) -> dict[str, float]:
        if series.empty:
            return {}
        return {f"p{q}": round(float(series.quantile(q / 100)), 4) for q in (50, 90, 99)} | {
            "max": round(float(series.max()), 4)}

    return {
        "trace": str(path),
        "model": header.model,
        "source": header.source.generator,
        "context_length": header.context_length,
        "trajectories": len(trajectories),
        "groups": int(trajectories["group"].nunique()),
        "turns": int(len(turns)),
        "turns_per_trajectory": quantiles(trajectories["turns"]),
        "output_tokens": int(turns["completion_tokens"].sum()),
        "tool_output_tokens": quantiles(tool),
        "tool_outputs_over_half_context": int((tool > header.context_length / 2).sum()),
        "turn_latency_s": quantiles(turns["latency_s"]),
        "outcomes": {str(k): int(v) for k, v in trajectories["outcome"].value_counts(dropna=False).items()},
        "mean_reward": None if trajectories["reward"].isna().all() else round(float(trajectories["reward"].mean()), 4),
    }


def write_trace_report(path: str | Path, out_dir: str | Path, *, show_progress: bool = False) -> dict[str, Any]:
    """Write `trajectories.csv`, `turns.csv` and `summary.json` for the trace into `out_dir`."""
    out = Path(out_dir)
    header, trajectories, turns = trace_tables(path, show_progress=show_progress)
    summary = summarize(path, header, trajectories, turns)
    out.mkdir(parents=True, exist_ok=True)
    trajectories.to_csv(out / "trajectories.csv", index=False)
    turns.to_csv(out / "turns.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable table of a summary."""
    rows = [
        ("trace", summary["trace"]),
        ("trajectories / groups", f"{summary['trajectories']} / {summary['groups']}"),
        ("turns (p50 / max)", f"{summary['turns_per_trajectory'].get('p50')} / {summary['turns_per_trajectory'].get('max')}"),
        ("output tokens", summary["output_tokens"]),
        ("tool output tokens (p50 / p99 / max)", _tool_outputs(summary["tool_output_tokens"])),
        ("tool outputs > half the context", summary["tool_outputs_over_half_context"]),
        ("turn latency s (p50 / p99)", f"{summary['turn_latency_s'].get('p50')} / {summary['turn_latency_s'].get('p99')}"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())),
        ("mean reward", "none recorded" if summary["mean_reward"] is None else summary["mean_reward"]),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def _tool_outputs(stats: dict[str, Any]) -> str:
    values = [stats.get(k) for k in ("p50", "p99", "max")]
    return "none in this trace" if all(v is None for v in values) else " / ".join(str(v) for v in values)
