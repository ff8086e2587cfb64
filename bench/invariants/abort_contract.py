"""Abort contract: an aborted placeholder carries zero loss and zero reward, and nothing aborted is scored as completed."""

from __future__ import annotations

from .base import RunView, Violation, preceding

NAME = "abort_contract"


def check(view: RunView) -> list[Violation]:
    out = []
    aborted_by_fault = {e.trajectory for e in view.fault_events if e.fault == "abort"}
    for record in view.records:
        if record.outcome == "aborted":
            if any(record.loss_mask) or (record.reward or 0.0) != 0.0:
                out.append(Violation(NAME, record.trajectory, "aborted sample still trains: loss or reward non-zero",
                                     {"loss_mask_sum": sum(record.loss_mask), "reward": record.reward},
                                     preceding(view, record.trajectory, record)))
        elif record.outcome == "completed" and record.trajectory in aborted_by_fault and record.status == "ABORT":
            out.append(Violation(NAME, record.trajectory, "an aborted answer was scored as completed",
                                 {"status": record.status}, preceding(view, record.trajectory, record)))
    return out
