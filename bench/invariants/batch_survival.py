"""Batch survival: one trajectory's failure never takes its siblings down, unless the framework's
declared policy is fail-fast, in which case the failure is raised with its root cause, not `CancelledError`.

The root cause is what raised (`root_cause`): the trajectory whose code raised the batch's exception,
and whether an injected fault reached it. A crash on a valid reply is a violation whatever the policy:
fail-fast is for refusing bad input, not for the target's own bugs. A fail-fast target that stops on an
injected fault is correct (the summary says which fault it refused). When the exception names no
trajectory, the trajectories the target itself reported `failed` are taken as the candidates; a crash
that the bench can tie to no trajectory at all hides its root cause, and is reported as such.
"""

from __future__ import annotations

from dataclasses import asdict

from bench.records.sample import SampleRecord
from faults import FaultEvent

from .base import RunView, Violation
from .root_cause import RootCause, excuses, root_cause

NAME = "batch_survival"
_HIDDEN = ("CancelledError", "TimeoutError")


def fail_closed_on(records: list[SampleRecord], fault_events: list[FaultEvent], cause: RootCause) -> list[FaultEvent]:
    """For a fail-fast crash: the injected faults that explain the stop, the last one on each trajectory that
    reached it (the trajectory that raised, else the ones the target reported failed)."""
    if cause.trajectory is not None:
        return [cause.fault] if cause.fault is not None else []
    last: dict[str, FaultEvent] = {}
    for event in fault_events:
        if excuses(event):
            last[event.trajectory] = event
    return [last[r.trajectory] for r in records if r.outcome == "failed" and r.trajectory in last]


def check(view: RunView) -> list[Violation]:
    if view.hang is not None or view.batch_error is None:
        return []  # hangs are liveness's
    cause = root_cause(view.batch_error, view.fault_events)
    lost = [r for r in view.records if r.outcome == "lost"]
    evidence = {"lost": len(lost), "dispatched": len(view.dispatched), "error_type": cause.error.type,
                "error": cause.error.message, "raised_by": cause.trajectory, "on_valid_reply": cause.on_valid_reply,
                "traceback": cause.error.traceback}
    fault = asdict(cause.fault) if cause.fault else None
    out = []
    if not view.fail_fast and lost:
        out.append(Violation(NAME, cause.trajectory, f"the batch crashed: {len(lost)} of {len(view.dispatched)} "
                             f"trajectories lost after {cause.explain()}", evidence, fault))
    elif view.fail_fast and cause.on_valid_reply:
        out.append(Violation(NAME, cause.trajectory, f"a fail-fast batch crashed on a valid reply: {cause.explain()}",
                             evidence, fault))
    elif view.fail_fast and not fail_closed_on(view.records, view.fault_events, cause):
        out.append(Violation(NAME, cause.trajectory,
                             f"a fail-fast batch crashed without a root cause the bench can check: {cause.explain()}; "
                             f"no trajectory it reported failed received an injected fault "
                             f"({len(view.fault_events)} fault events in the run)", evidence, fault))
    if cause.error.type in _HIDDEN:
        out.append(Violation(NAME, cause.trajectory, f"the root cause is hidden: the batch failed with "
                             f"{cause.error.type}", evidence, fault))
    return out
