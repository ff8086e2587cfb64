"""Liveness: the batch finishes within its budget and its deadline; a run that stopped making progress
(no sample finished, no recorded turn newly answered) for the watchdog's window is a hang when nothing
flowed and a livelock when requests kept coming. Each is reported with the stacks the watchdog took."""

from __future__ import annotations

from typing import Any

from .base import HangReport, RunView, Violation

NAME = "liveness"


def _message(hang: HangReport) -> str:
    if hang.kind == "livelock":
        rate = hang.requests_in_window / hang.window_s if hang.window_s > 0 else 0.0
        return (f"livelock: {hang.requests_in_window} requests in {hang.window_s:.1f} s ({rate:.1f}/s), but no "
                f"sample finished and no recorded turn was newly answered: the run went in circles")
    if hang.kind == "deadline":
        return f"deadline: the run was still going after its {hang.deadline_s:g} s deadline and was ended"
    return f"no progress for {hang.idle_s:.1f} s: the run hung"


def _evidence(hang: HangReport) -> dict[str, Any]:
    rate = hang.requests_in_window / hang.window_s if hang.window_s > 0 else 0.0
    evidence: dict[str, Any] = {"kind": hang.kind, "idle_s": round(hang.idle_s, 3),
                                "requests_in_window": hang.requests_in_window, "window_s": round(hang.window_s, 3),
                                "requests_per_s": round(rate, 3)}
    if hang.deadline_s is not None:
        evidence["deadline_s"] = hang.deadline_s
    return {**evidence, "pending_tasks": len(hang.stacks), "stacks": hang.stacks[:20]}


def check(view: RunView) -> list[Violation]:
    out = []
    if view.hang is not None:
        out.append(Violation(NAME, None, _message(view.hang), _evidence(view.hang)))
    budget = view.bounds.run_budget_s
    if budget is not None and view.duration_s > budget:
        out.append(Violation(NAME, None, f"the run took {view.duration_s:.1f} s (budget {budget:g} s)",
                             {"duration_s": view.duration_s}))
    return out
