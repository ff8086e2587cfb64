"""`summary.json`: what a run was and what it found, in one small document."""

from __future__ import annotations

import importlib.metadata
import platform
from collections import Counter
from typing import Any

import pandas as pd

from bench import __version__
from bench.invariants.batch_survival import fail_closed_on
from bench.invariants.provenance import LOGPROB_TOLERANCE
from bench.invariants.replay_fidelity import describe as describe_fidelity
from bench.invariants.replay_fidelity import measure as measure_fidelity
from bench.invariants.replay_fidelity import not_applicable
from bench.invariants.root_cause import root_cause
from bench.invariants.vacuity import reach
from bench.orchestration.runner import RunResult
from bench.records.sample import DROPPED_OUTCOMES, OUTCOMES
from bench.server.profiles import DEFAULT_ENGINE
from bench.server.router import GENERATION_ROUTES
from bench.steps.report import step_lines

from .status import honesty_line, honesty_summary


def _versions() -> dict[str, str]:
    out = {"rollout-bench": __version__, "python": platform.python_version()}
    for package in ("aiohttp", "pandas", "msgspec"):
        out[package] = importlib.metadata.version(package)
    return out


def _quantiles(series: pd.Series) -> dict[str, float | None]:
    clean = series.dropna()
    return {f"p{q}": (round(float(clean.quantile(q / 100)), 6) if len(clean) else None) for q in (50, 90, 99)}


def bench_cpu_us_per_request(bench_cpu_s: float, requests: pd.DataFrame) -> float | None:
    """The bench's CPU per generation request it served, in µs (None: it served none); admin requests
    (health, model info) are cheap and a target's own habit, so they do not dilute the figure."""
    served = int(requests["endpoint"].isin(GENERATION_ROUTES).sum()) if len(requests) else 0
    return round(bench_cpu_s / served * 1e6, 1) if served else None


def orphaned_requests(trajectories: pd.DataFrame, requests: pd.DataFrame, returned_at: float | None) -> int:
    """Requests started before the rollout returned for trajectories it never gave back (outcome `lost`).

    That is the work a crashed batch threw away: requests in flight when it went down (cut, or
    answered to nobody) and answers that arrived before the crash but died with their group; without a
    crash, the work a target silently left out of what it returned (a partial group's missing members).
    """
    if returned_at is None or requests.empty:
        return 0
    lost = set(trajectories.loc[trajectories["outcome"] == "lost", "trajectory"])
    return int((requests["trajectory"].isin(lost) & (requests["started"] <= returned_at)).sum())


def _batch_error(result: RunResult) -> dict[str, Any]:
    """The root cause; for a crash no invariant objects to (a fail-fast target), the faults it refused."""
    assert result.batch_error is not None
    cause = root_cause(result.batch_error, result.fault_events)
    out = cause.to_dict()
    if not any(v.invariant == "batch_survival" for v in result.violations + [k.violation for k in
                                                                              result.known_violations]):
        out["fail_closed_on"] = [{"trajectory": e.trajectory, "fault": e.fault, "rule": e.rule, "turn": e.turn,
                                  "attempt": e.attempt}
                                 for e in fail_closed_on(result.records, result.fault_events, cause)]
    return out


def hit_by_fault(trajectories: pd.DataFrame) -> dict[str, pd.Series]:
    """Per fault type (sorted), which trajectories it reached (the table's comma-separated `faults`)."""
    names = trajectories["faults"].fillna("").astype(str).str.split(",")
    return {fault: names.apply(lambda cell, f=fault: f in cell)
            for fault in sorted({f for cell in names for f in cell if f})}


def provenance_summary(result: RunResult, trajectories: pd.DataFrame) -> dict[str, Any]:
    """Samples matched, mismatched and not checked (with why); per fault type that reached them, how many of the
    checked samples it hit do not hold what they were served."""
    labels = trajectories["provenance"].fillna("not checked: no verdict")
    checked = ~labels.str.startswith("not checked")
    mismatch = labels.str.startswith("mismatch")
    by_fault: dict[str, dict[str, Any]] = {}
    hits = hit_by_fault(trajectories)
    for fault, hit in hits.items():
        hit = hit & checked
        by_fault[fault] = {"checked": int(hit.sum()), "mismatch": int((hit & mismatch).sum())}
    clean = ~pd.concat(hits.values(), axis=1).any(axis=1) & checked if hits else checked
    by_fault["none"] = {"checked": int(clean.sum()), "mismatch": int((clean & mismatch).sum())}
    served = result.served
    return {
        "tokens_source": result.tokens_source,
        "logprob_tolerance": LOGPROB_TOLERANCE,
        "match": int((labels.str.startswith("match")).sum()),
        "mismatch": int(mismatch.sum()),
        "checks": {str(k): int(v) for k, v in labels[checked].str.extract(r"\((.*)\)")[0].value_counts().items()},
        "not_checked": {str(k).removeprefix("not checked: "): int(v)
                        for k, v in labels[~checked].value_counts().items()},
        "by_fault": by_fault,
        "served_tokens": len(served.ids) if served is not None else None,
        "served_bytes": served.nbytes() if served is not None else None,
    }


def _status_verdicts(trajectories: pd.DataFrame) -> dict[str, str]:
    """The trajectories table's `status_honest` verdicts (`bench.report.status`, judged once, in `frames`)."""
    if "status_honest" not in trajectories:
        return {}
    return {str(t): v for t, v in zip(trajectories["trajectory"], trajectories["status_honest"]) if isinstance(v, str)}


def summarize(result: RunResult, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    trajectories, requests = tables["trajectories"], tables["requests"]
    n = len(trajectories)
    outcomes = {name: int((trajectories["outcome"] == name).sum()) for name in OUTCOMES}
    dropped = trajectories["outcome"].isin(DROPPED_OUTCOMES)
    by_fault: dict[str, dict[str, float | int]] = {}
    for fault, hit in hit_by_fault(trajectories).items():
        by_fault[fault] = {"trajectories": int(hit.sum()), "drop_rate": round(float(dropped[hit].mean()), 6)}
    faults = tables["faults"]
    for fault, reaches in (faults.groupby("fault")["reach"].value_counts().unstack(fill_value=0).iterrows()
                           if len(faults) else ()):
        entry = by_fault.setdefault(fault, {"trajectories": 0, "drop_rate": None})
        entry["events_by_reach"] = {str(k): int(v) for k, v in reaches.items() if v}
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
        "framework": result.framework,
        "versions": _versions(),
        "started": result.started,
        "duration_s": round(result.duration_s, 4),
        "trajectories": n,
        # SIGINT/SIGTERM ended the run early: the report holds what came back until then
        "interrupted": None if not result.interrupted else {
            "signal": result.interrupted, "violations_not_judged": result.violations_not_judged},
        "outcomes": outcomes,
        "drop_rate": round(float(dropped.mean()), 6) if n else 0.0,
        "drop_rate_by_fault": by_fault,
        # what raised, whose code raised it, whether an injected fault reached it, the full traceback
        "batch_error": None if result.batch_error is None else _batch_error(result),
        "hang": None if result.hang is None else {"idle_s": result.hang.idle_s, "kind": result.hang.kind,
                                                  "requests_in_window": result.hang.requests_in_window,
                                                  "deadline_s": result.hang.deadline_s,
                                                  "pending_tasks": len(result.hang.stacks)},
        # how the requests matched the recording: `unfaithful` above the bound (the replay_fidelity invariant)
        "fidelity": fidelity.to_dict(result.config.bounds.max_drift_share) if result.config.upstream is None
        else not_applicable(result.config.upstream),
        "upstream": result.config.upstream,
        "server": result.server,  # the SGLang version and build the mock played: a behaviour judged is one build's
        "violations": [v.to_dict() for v in result.violations],
        "violated_invariants": sorted({v.invariant for v in result.violations}),
        # violations a known-findings file declared (reported, not failures): `bench.orchestration.known`
        "known_violations": [k.to_dict() for k in result.known_violations],
        "known_file": result.known_file,
        "repros": [],  # the verified repros, added once they are (`bench.orchestration.repro`, by the command line)
        # rules that never fired: not reached (the target stopped first) or never matched (a violation)
        "vacuity": vars(reach(plan, result.fault_events, result.records)),
        # did each sample train on what it was served (the provenance invariant), per check and per fault type
        "provenance": provenance_summary(result, trajectories),
        # samples cut at the context or by length yet COMPLETED: reported, not a violation (`bench.report.status`)
        "status_honesty": honesty_summary(_status_verdicts(trajectories)),
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
            # per generation request served: the figure that must stay small beside real rollout code
            "bench_cpu_us_per_request": bench_cpu_us_per_request(result.bench_cpu_s, requests),
            "target_cpu_s": None if result.worker is None else result.worker.get("cpu_s"),
        },
        "isolation": result.isolation,
        "worker": result.worker,
        "orphans_cancelled": result.orphans_cancelled,
        "orphaned_requests": orphaned_requests(trajectories, requests, result.target_returned_at),
        "steps": result.steps,  # a multi-step run (`run --steps K`): per-step rows, first violation (`bench.steps`)
    }


def framework_line(info: dict[str, str]) -> str:
    """`slime @ 624b824c9f1e (/src/slime)`, `miles-rl 0.0.2`: the code a run judged, in one line."""
    name = info.get("framework", "?")
    if "commit" in info:
        return f"{name} @ {info['commit']} ({info.get('source', '?')})"
    rest = ", ".join(f"{key} {value}" for key, value in info.items() if key not in ("framework", "version"))
    return f"{name} {info.get('version', '')}".strip() + (f" ({rest})" if rest else "")


def format_summary(summary: dict[str, Any], folder: str | None = None) -> str:
    """The terminal's end-of-run table (`folder`: the report's, named where the whole traceback is)."""
    outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items() if v)
    interrupted = summary.get("interrupted")
    lines = [
        *([("INTERRUPTED", f"by {interrupted['signal']}: what came back until then; "
                           f"{interrupted['violations_not_judged']} findings on cut-off trajectories or the whole "
                           "run not judged")] if interrupted else []),
        ("target", summary["target"]),
        *([("framework", framework_line(summary["framework"]))] if summary.get("framework") else []),
        *([("server", f"SGLang {served['sglang_version']}, build {served['sglang_build']}")]
          if (served := summary.get("server")) and served["sglang_build"] != DEFAULT_ENGINE else []),
        ("plan / seed", f"{summary['plan']} / {summary['seed']}"),
        ("trajectories", f"{summary['trajectories']} ({outcomes})"),
        ("drop rate", f"{summary['drop_rate']:.2%}"),
    ]
    for fault, stats in summary["drop_rate_by_fault"].items():
        rate = f"{stats['drop_rate']:.2%}" if stats["drop_rate"] is not None else "-"
        missed = {k: v for k, v in (stats.get("events_by_reach") or {}).items() if k not in ("consumed", "delivered")}
        lines.append((f"  {fault}", f"{rate} of {stats['trajectories']} hit"
                      + "".join(f"; {count} {reach}" for reach, count in missed.items())))
    throughput = summary["throughput"]
    lines.append(("throughput", f"{throughput.get('samples_per_s', throughput['trajectories_per_s'])} samples/s, {throughput['requests_per_s']} req/s, "
                                f"{throughput['output_tokens_per_s']} tok/s"))
    if "bench_cpu_s" in throughput:
        per_request = throughput.get("bench_cpu_us_per_request")
        lines.append(("bench overhead", f"{throughput['bench_cpu_s']} s CPU in the bench = "
                                    f"{throughput['bench_cpu_share']:.0%} of the wall time"
                                        + (f", {per_request:g} µs per request" if per_request is not None else "")
                                        + (f"; target {throughput['target_cpu_s']} s CPU"
                                           if throughput['target_cpu_s'] is not None else "")))
    if summary.get("orphaned_requests"):
        whose = "the crash lost" if summary["batch_error"] else "the target never gave back"
        lines.append(("orphaned requests",
                      f"{summary['orphaned_requests']} sent for trajectories {whose} (answered or cut)"))
    error = summary["batch_error"]
    if error:
        lines.append(("batch error", error.get("explanation") or f"{error['type']}: {error['message']}"))
        for refused in (error.get("fail_closed_on") or [])[:5]:
            lines.append(("  failed closed", f"on the injected fault {refused['fault']} (rule {refused['rule']}) "
                                             f"reaching {refused['trajectory']} turn {refused['turn']}: correct"))
    if summary["hang"]:
        hang = summary["hang"]
        kind = hang.get("kind", "hang")
        during = f" ({hang['requests_in_window']} requests meanwhile)" if kind == "livelock" else ""
        what = f"ended at its {hang['deadline_s']:g} s deadline" if kind == "deadline" else \
            f"no progress for {hang['idle_s']} s{during}"
        judged = any(v.get("invariant") == "liveness" for v in summary.get("violations") or [])  # not left out
        stacks = " (their stacks: the liveness violation's evidence in summary.json)" \
            if hang["pending_tasks"] and judged else ""
        lines.append((kind, f"{what}; {hang['pending_tasks']} tasks pending{stacks}"))
    provenance = summary.get("provenance")
    if provenance:
        lines.append(("provenance", _provenance_line(provenance)))
    honesty = honesty_line(summary.get("status_honesty") or {})
    if honesty:
        lines.append(("status honesty", honesty))
    not_reached = (summary.get("vacuity") or {}).get("not_reached")
    if not_reached:
        lines.append(("not reached", f"{', '.join(not_reached)}: rules the target stopped before (no verdict on them)"))
    fidelity = summary.get("fidelity")
    if fidelity and fidelity.get("applies") is False:
        lines.append(("replay fidelity", f"does not apply: {fidelity['why']}"))
    elif fidelity:
        verdict = "UNFAITHFUL, the findings are not about the recording" if fidelity["unfaithful"] else "faithful"
        lines.append(("replay fidelity", f"{verdict}: {describe_fidelity(fidelity)}"))
    lines += step_lines(summary)
    violations = summary["violations"]
    lines.append(("violations", _violation_counts(violations) if violations else "none"))
    for violation in violations[:10]:
        times = violation.get("occurrences", 1)
        lines.append((f"  {violation['invariant']}", f"{violation['trajectory'] or '-'}: {violation['message']}"
                      + (f" (x{times})" if times > 1 else "")))
    if len(violations) > 10:
        lines.append(("  ...", f"{len(violations) - 10} more in summary.json"))
    known = summary.get("known_violations") or []
    if known:
        lines.append(("known violations", f"{len(known)}, declared in {summary.get('known_file')}: not failures"))
        for (invariant, reason), count in Counter((k["invariant"], k["reason"]) for k in known).items():
            lines.append((f"  {invariant}", f"x{count}: {reason}"))
    width = max(len(k) for k, _ in lines)
    table = "\n".join(f"  {k:<{width}}  {v}" for k, v in lines)
    return table + _traceback_tail(error, folder)


def _provenance_line(provenance: dict[str, Any]) -> str:
    """'500 checked: 497 match, 3 mismatch (tokens+logprobs 490, tokens 10); 20 not checked; mismatch by fault:
    abort 2 of 31'."""
    checks = ", ".join(f"{k} {v}" for k, v in provenance["checks"].items())
    text = (f"{provenance['match'] + provenance['mismatch']} checked{f' ({checks})' if checks else ''}: "
            f"{provenance['match']} match, "
            f"{provenance['mismatch']} mismatch; {sum(provenance['not_checked'].values())} not checked")
    faulty = [f"{fault} {stats['mismatch']} of {stats['checked']}" for fault, stats in provenance["by_fault"].items()
              if stats["mismatch"]]
    return text + (f"; mismatch by fault: {', '.join(faulty)}" if faulty else "")


def _violation_counts(violations: list[dict[str, Any]]) -> str:
    """'9 on 8 trajectories: context_budget 8 (476 occurrences), batch_survival 1'."""
    trajectories = {v["trajectory"] for v in violations if v["trajectory"]}
    by_invariant: dict[str, list[int]] = {}
    for violation in violations:
        by_invariant.setdefault(violation["invariant"], []).append(violation.get("occurrences", 1))
    parts = [f"{name} {len(times)}" + (f" ({sum(times)} occurrences)" if sum(times) > len(times) else "")
             for name, times in by_invariant.items()]
    return f"{len(violations)} on {len(trajectories)} trajectories: {', '.join(parts)}"


def _traceback_tail(error: dict[str, Any] | None, folder: str | None, lines: int = 8) -> str:
    """The last frames of the batch's exception (the line that failed), and where the whole text is."""
    text = (error or {}).get("traceback") or ""
    if not text:
        return ""
    tail = text.rstrip().splitlines()[-lines:]
    where = f"{folder}/summary.json" if folder else "summary.json"
    return ("\n\n  traceback (last lines; the whole of it, chain included, is batch_error.traceback in "
            f"{where}):\n" + "\n".join(f"    {line}" for line in tail))
