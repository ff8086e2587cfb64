"""Retry discipline: no retry storm, and terminal errors (the router's no-workers 503) fail fast."""

from __future__ import annotations

from collections import defaultdict

from .base import RunView, Violation, preceding

NAME = "retry_discipline"
TERMINAL = {"router_no_workers", "outage"}


def check(view: RunView) -> list[Violation]:
    per_trajectory: dict[str, int] = defaultdict(int)
    for request in view.requests:
        if request.trajectory is not None:
            per_trajectory[request.trajectory] += 1
    out = []
    bound = view.bounds.max_requests_per_trajectory
    for trajectory, count in per_trajectory.items():
        if count > bound:
            out.append(Violation(NAME, trajectory, f"{count} requests for one trajectory (bound {bound})",
                                 {"requests": count}, preceding(view, trajectory)))
    terminal: dict[str, int] = defaultdict(int)
    for event in view.fault_events:
        if event.fault in TERMINAL:
            terminal[event.trajectory] += 1
    limit = view.bounds.max_requests_after_terminal
    for trajectory, count in terminal.items():
        if count > limit + 1:
            out.append(Violation(NAME, trajectory, f"kept retrying a terminal error: {count} no-workers answers "
                                 f"(bound {limit + 1})", {"terminal_answers": count}, preceding(view, trajectory)))
    return out
