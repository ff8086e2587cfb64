"""Group completeness: a group is complete, or dropped, or failed loudly; never silently partial."""

from __future__ import annotations

from collections import defaultdict

from .base import RunView, Violation

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
        # never reported by a target that returned normally: silently dropped, not lost in a crash
        silent = [t for t in trajectories if outcomes.get(t) is None
                  or (not crashed and view.emitted and view.emitted.get(t, 0) == 0)]
        if kept and silent:
            out.append(Violation(NAME, silent[0], f"group {group} is partial: {len(kept)} kept, "
                                 f"{len(silent)} missing without an outcome",
                                 {"group": group, "kept": kept, "missing": silent}))
    return out
