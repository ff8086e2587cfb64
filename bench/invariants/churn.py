"""Batch-level churn, measured from the request log and the records only (retry_discipline's batch check).

Progress is a finished sample, not a request: these numbers say how many requests the batch spent
for what it finished. A unit of work is one (trajectory, turn, prompt length), as in the
per-trajectory retry checks; a re-send is any request for a unit beyond its first.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from .base import RunView

FINISHED = ("completed", "truncated")


@dataclass(frozen=True)
class Churn:
    trajectories: int  # trajectories counted: reached, minus those a batch that raised lost
    requests: int
    resends: int  # requests beyond the first for their unit
    failed_resends: int  # re-sends not answered 200
    resend_statuses: dict[str, int]
    finished: int  # completed or truncated samples among the counted trajectories
    finished_turns: int  # the units those finished samples sent: the requests their work needed
    requests_per_finished_sample: float | None  # None when nothing finished
    groups_reached: int  # groups with at least one counted request
    replacement_rounds: int  # a group's first turn sent again to every one of its members
    groups_started: int  # reached + replacement rounds ("created")
    groups_finished: int  # groups with at least one finished sample
    largest_group: int  # members of the largest dispatched group

    def as_evidence(self) -> dict[str, Any]:
        return asdict(self)


def measure_churn(view: RunView) -> Churn:
    """The batch's requests against its finished samples (see the module docstring)."""
    outcomes = {r.trajectory: r.outcome for r in view.records}
    skipped = {t for t, o in outcomes.items() if o == "lost"} if view.batch_error is not None else set()
    units: dict[tuple[str, int, int], int] = defaultdict(int)
    resend_statuses: Counter[str] = Counter()
    requests = 0
    for request in view.requests:
        if request.trajectory is None or request.trajectory in skipped:
            continue
        requests += 1
        unit = (request.trajectory, request.turn or 0, request.prompt_tokens or 0)
        units[unit] += 1
        if units[unit] > 1:
            resend_statuses[str(request.status)] += 1
    reached = {t for t, _, _ in units}
    finished = {t for t in reached if outcomes.get(t) in FINISHED}
    first_turn_sends: dict[str, int] = defaultdict(int)
    for (trajectory, turn, _), count in units.items():
        if turn == 0:
            first_turn_sends[trajectory] += count
    members: dict[str, list[str]] = defaultdict(list)
    for trajectory in reached:
        members[view.dispatched.get(trajectory, trajectory)].append(trajectory)
    rounds = sum(max(0, min(first_turn_sends[m] for m in group) - 1) for group in members.values())
    sizes = Counter(view.dispatched.values())
    resends = sum(resend_statuses.values())
    return Churn(
        trajectories=len(reached), requests=requests, resends=resends,
        failed_resends=resends - resend_statuses.get("200", 0), resend_statuses=dict(sorted(resend_statuses.items())),
        finished=len(finished), finished_turns=sum(1 for t, _, _ in units if t in finished),
        requests_per_finished_sample=round(requests / len(finished), 3) if finished else None,
        groups_reached=len(members), replacement_rounds=rounds, groups_started=len(members) + rounds,
        groups_finished=len({view.dispatched.get(t, t) for t in finished}),
        largest_group=max(sizes.values(), default=1))
