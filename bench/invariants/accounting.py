"""Accounting: every dispatched trajectory ends in exactly one outcome; every fault event is accounted for."""

from __future__ import annotations

from collections import Counter

from .base import RunView, Violation

NAME = "accounting"


def check(view: RunView) -> list[Violation]:
    out = []
    counts = Counter(r.trajectory for r in view.records)
    crashed = view.batch_error is not None or view.hang is not None
    for trajectory in view.dispatched:
        emitted = view.emitted.get(trajectory, 0)
        if counts[trajectory] != 1 or emitted > 1 or (emitted == 0 and not crashed):
            out.append(Violation(NAME, trajectory, f"the target reported {emitted} outcomes for one trajectory",
                                 {"emitted": emitted, "records": counts[trajectory]}))
    for trajectory in set(counts) | set(view.emitted):
        if trajectory not in view.dispatched:
            out.append(Violation(NAME, trajectory, "an outcome for a trajectory never dispatched", {}))
    for event in view.fault_events:
        if event.trajectory not in view.dispatched and not event.trajectory.startswith("request:"):
            out.append(Violation(NAME, event.trajectory, f"fault event {event.rule} on an undispatched trajectory",
                                 {"rule": event.rule}))
    return out
