"""`summary.json`: what a run was and what it found, in one small document."""

from __future__ import annotations

import importlib.metadata
import platform
from collections import Counter
from typing import Any

import pandas as pd

from .. import __version__
from ..invariants.replay_fidelity import describe as describe_fidelity, measure as measure_fidelity
from ..runner import RunResult
from ..targets import DROPPED_OUTCOMES, OUTCOMES


def _versions() -> dict[str, str]:
    out = {"rollout-bench": __version__, "python": platform.python_version()}
    for package in ("aiohttp", "pandas", "msgspec"):
        out[package] = importlib.metadata.version(package)
    return out


def _quantiles(series: pd.Series) -> dict[str, float | None]:
    clean = series.dropna()
    return {f"p{q}": (round(float(clean.quantile(q / 100)), 6) if len(clean) else None) for q in (50, 90, 99)}


def orphaned_requests(trajectories: pd.DataFrame, requests: pd.DataFrame, returned_at: float | None) -> int:
    """Requests started before the rollout returned for trajectories it never gave back (outcome `lost`).

    That is the work a crashed batch threw away: requests in flight when it went down (cut, or
    answered to nobody) and answers that arrived before the crash but died with their group.
    """
    if returned_at is None or requests.empty:
        return 0
    lost = set(trajectories.loc[trajectories["outcome"] == "lost", "trajectory"])
    return int((requests["trajectory"].isin(lost) & (requests["started"] <= returned_at)).sum())


def summarize(result: RunResult, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    trajectories, requests = tables["trajectories"], tables["requests"]
    n = len(trajectories)
    outcomes = {name: int((trajectories["outcome"] == name).sum()) for name in OUTCOMES}
    dropped = trajectories["outcome"].isin(DROPPED_OUTCOMES)
    by_fault: dict[str, dict[str, float | int]] = {}
    for fault in sorted({f for cell in trajectories["faults"].fillna("") for f in str(cell).split(",") if f}):
        hit = trajectories["faults"].fillna("").str.split(",").apply(lambda names, f=fault: f in names)
        by_fault[fault] = {"trajectories": int(hit.sum()), "drop_rate": round(float(dropped[hit].mean()), 6)}
    turns = requests.dropna(subset=["trajectory"]).drop_duplicates(["trajectory", "turn"])
    duration = max(result.duration_s, 1e-9)
    plan = result.config.plan
    fidelity = measure_fidelity(result.requests, result.fault_events)
    return {
        "seed": plan.seed if plan else None,
        "plan": plan.name if plan else None,
        "plan_source": plan.source if plan else None,
        "trace": result.trace_path,
        "target": result.target,
        "versions": _versions(),
        "started": result.started,
        "duration_s": round(result.duration_s, 4),
        "trajectories": n,
        "outcomes": outcomes,
        "drop_rate": round(float(dropped.mean()), 6) if n else 0.0,
        "drop_rate_by_fault": by_fault,
        "batch_error": None if result.batch_error is None else {
            "type": result.batch_error.type, "message": result.batch_error.message},
        "hang": None if result.hang is None else {"idle_s": result.hang.idle_s,
                                                  "pending_tasks": len(result.hang.stacks)},
        # how the requests matched the recording: `unfaithful` above the bound (the replay_fidelity invariant)
        "fidelity": fidelity.to_dict(result.config.bounds.max_drift_share),
        "violations": [v.to_dict() for v in result.violations],
        "violated_invariants": sorted({v.invariant for v in result.violations}),
        # violations a known-findings file declared (reported, not failures): `bench.known`
        "known_violations": [k.to_dict() for k in result.known_violations],
        "known_file": result.known_file,
        "throughput": {
            "trajectories_per_s": round(n / duration, 3),
            "samples_per_s": round(int((~trajectories["outcome"].eq("lost")).sum()) / duration, 3),
            "requests_per_s": round(len(requests) / duration, 3),
            "output_tokens_per_s": round(float(requests["completion_tokens"].fillna(0).sum()) / duration, 3),
            "latency_s": _quantiles(requests["latency_s"]),
            "retry_amplification": round(len(requests.dropna(subset=["trajectory"])) / max(1, len(turns)), 4),
            # how much of the wall time the bench itself used: server, fault engine, checks (and the target
            # too when it runs inline); a real target's own CPU is reported beside it
            "bench_cpu_s": round(result.bench_cpu_s, 3),
            "bench_cpu_share": round(result.bench_cpu_s / duration, 4),
            "target_cpu_s": None if result.worker is None else result.worker.get("cpu_s"),
        },
        "isolation": result.isolation,
        "worker": result.worker,
        "orphans_cancelled": result.orphans_cancelled,
        "orphaned_requests": orphaned_requests(trajectories, requests, result.target_returned_at),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The terminal's end-of-run table."""
    outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items() if v)
    lines = [
        ("target", summary["target"]),
        ("plan / seed", f"{summary['plan']} / {summary['seed']}"),
        ("trajectories", f"{summary['trajectories']} ({outcomes})"),
        ("drop rate", f"{summary['drop_rate']:.2%}"),
    ]
    for fault, stats in summary["drop_rate_by_fault"].items():
        lines.append((f"  {fault}", f"{stats['drop_rate']:.2%} of {stats['trajectories']} hit"))
    throughput = summary["throughput"]
    lines.append(("throughput", f"{throughput.get('samples_per_s', throughput['trajectories_per_s'])} samples/s, {throughput['requests_per_s']} req/s, "
                                f"{throughput['output_tokens_per_s']} tok/s"))
    if "bench_cpu_s" in throughput:
        lines.append(("bench overhead", f"{throughput['bench_cpu_s']} s CPU in the bench = "
                                    f"{throughput['bench_cpu_share']:.0%} of the wall time"
                                        + (f"; target {throughput['target_cpu_s']} s CPU"
                                           if throughput['target_cpu_s'] is not None else "")))
    if summary.get("orphaned_requests"):
        lines.append(("orphaned requests", f"{summary['orphaned_requests']} served for trajectories the crash lost"))
    if summary["batch_error"]:
        lines.append(("batch error", f"{summary['batch_error']['type']}: {summary['batch_error']['message']}"))
    if summary["hang"]:
        lines.append(("hang", f"no progress for {summary['hang']['idle_s']} s; "
                              f"{summary['hang']['pending_tasks']} tasks pending"))
    fidelity = summary.get("fidelity")
    if fidelity:
        verdict = "UNFAITHFUL, the findings are not about the recording" if fidelity["unfaithful"] else "faithful"
        lines.append(("replay fidelity", f"{verdict}: {describe_fidelity(fidelity)}"))
    violations = summary["violations"]
    lines.append(("violations", str(len(violations)) if violations else "none"))
    for violation in violations[:10]:
        lines.append((f"  {violation['invariant']}", f"{violation['trajectory'] or '-'}: {violation['message']}"))
    known = summary.get("known_violations") or []
    if known:
        lines.append(("known violations", f"{len(known)}, declared in {summary.get('known_file')}: not failures"))
        for (invariant, reason), count in Counter((k["invariant"], k["reason"]) for k in known).items():
            lines.append((f"  {invariant}", f"x{count}: {reason}"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in lines)
