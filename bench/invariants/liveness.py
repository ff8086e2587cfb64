"""Liveness: the batch finishes within its budget, or the watchdog reports the hang with task stacks."""

from __future__ import annotations

from .base import RunView, Violation

NAME = "liveness"


def check(view: RunView) -> list[Violation]:
    out = []
    if view.hang is not None:
        out.append(Violation(NAME, None, f"no progress for {view.hang.idle_s:.1f} s: the run hung",
                             {"pending_tasks": len(view.hang.stacks), "stacks": view.hang.stacks[:20]}))
    budget = view.bounds.run_budget_s
    if budget is not None and view.duration_s > budget:
        out.append(Violation(NAME, None, f"the run took {view.duration_s:.1f} s (budget {budget:g} s)",
                             {"duration_s": view.duration_s}))
    return out
