"""Group completeness: a group is complete, or dropped, or failed loudly; never silently partial.

A member is *silently missing* when no outcome exists for it, or when a target that returned
normally never emitted a record for it (the runner then fills in `lost`, "the target returned no
record"): the framework lost it without a word. A group with kept members (completed, truncated,
aborted placeholders) and silently missing ones is what a trainer computes advantages over
without knowing it is partial (verl#6437). Members lost in a crash or a hang are not silent:
batch survival and liveness report those. A member reported `failed` or `dropped` is loud.

The violation names the group, its kept and missing members, each missing member's fault
events, and (as `fault`) the last fault event on the first missing member that had one: the likely
root cause.
"""

from __future__ import annotations

from collections import defaultdict

from .base import RunView, Violation, preceding

NAME = "group_completeness"
_KEPT = ("completed", "truncated", "aborted")


def check(view: RunView) -> list[Violation]:
    members: dict[str, list[str]] = defaultdict(list)
    for trajectory, group in view.dispatched.items():
        members[group].append(trajectory)
    outcomes = {r.trajectory: r.outcome for r in view.records}
    crashed = view.batch_error is not None or view.hang is not None
    out = []
    for group, trajectories in members.items():
        kept = [t for t in trajectories if outcomes.get(t) in _KEPT]
        # never reported by a target that returned normally: silently dropped, not lost in a crash.
        # (An empty `emitted` means the view does not know what was emitted: records are taken as emitted.)
        silent = [t for t in trajectories if outcomes.get(t) is None
                  or (not crashed and view.emitted and view.emitted.get(t, 0) == 0)]
        if kept and silent:
            faults = {t: [e.fault for e in view.faults_for(t)] for t in silent if view.faults_for(t)}
            culprit = next(iter(faults), silent[0])
            out.append(Violation(NAME, culprit, f"group {group} is partial: {len(kept)} kept, "
                                 f"{len(silent)} missing without an outcome ({', '.join(silent)})",
                                 {"group": group, "kept": kept, "missing": silent, "missing_faults": faults},
                                 preceding(view, culprit)))
    return out
