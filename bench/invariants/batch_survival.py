"""Batch survival: one trajectory's failure never takes its siblings down, unless the framework's
declared policy is fail-fast, in which case the failure is raised with its root cause, not `CancelledError`."""

from __future__ import annotations

from .base import RunView, Violation, preceding

NAME = "batch_survival"
_HIDDEN = ("CancelledError", "TimeoutError")


def check(view: RunView) -> list[Violation]:
    lost = [r for r in view.records if r.outcome == "lost"]
    if view.hang is not None or view.batch_error is None or not lost:
        return []  # hangs are liveness's; records a returning target never sent are accounting's
    error = view.batch_error
    culprits = [e.trajectory for e in view.fault_events]
    culprit = culprits[0] if culprits else None
    evidence = {"lost": len(lost), "dispatched": len(view.dispatched), "error_type": error.type,
                "error": error.message, "culprit": culprit}
    out = []
    if not view.fail_fast:
        out.append(Violation(NAME, culprit,
                             f"the batch crashed: {len(lost)} of {len(view.dispatched)} trajectories lost "
                             f"after {error.type}: {error.message}",
                             evidence, preceding(view, culprit)))
    if error.type in _HIDDEN:
        out.append(Violation(NAME, culprit, f"the root cause is hidden: the batch failed with {error.type}",
                             evidence, preceding(view, culprit)))
    return out
