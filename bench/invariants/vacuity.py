"""Vacuity: every server-side rule of the plan fired at least once (else the run proved nothing about it).

A rule that never fired is one of two things, and only the second is a violation:

- not reached: the target stopped before running the rule's trajectories to their end, so the
  rule never had its chance. Reached work is read from the records: a trajectory the target
  ended in its own way (any outcome but `lost`) was run to its end; a `lost` one was not (the
  batch crashed or failed closed, the run hung or missed its deadline, or the target returned
  without a record for it, possibly without ever requesting it). A rule is not reached when
  one of those lost trajectories lies in its scope (its `trajectories` and `groups`; its other
  schedule keys cannot be judged on work never sent, so they count as possibly matching).
- never matched: every trajectory in the rule's scope was run to its end (or none was in the
  run at all) and the schedule matched none of the requests it sent: the plan asked for
  something this target never does (a tool-output rule on a single-turn rollout, `turns=[99]`).

A trajectory the target ended early on purpose (a failed or aborted record) counts as run to its
end: the target chose to stop it, so rules on its later turns are never matched, not unreached.
The not-reached rules are no failure but are reported (`reach`; the summary's `vacuity` block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from bench.records.sample import SampleRecord
from faults import FaultEvent, Plan
from faults.plan import Rule

from .base import RunView, Violation

NAME = "vacuity"


@dataclass(frozen=True)
class Reach:
    """The plan's server-side rules that never fired, split by why."""

    not_reached: list[str]  # the target stopped before the rule's scope was run to its end
    never_matched: list[str]  # the rule's scope was run to its end and its schedule matched nothing


def _in_scope(rule: Rule, trajectory: str, group: str | None) -> bool:
    schedule = rule.schedule
    return ((schedule.trajectories is None or trajectory in schedule.trajectories)
            and (schedule.groups is None or group in schedule.groups))


def reach(plan: Plan | None, fault_events: Iterable[FaultEvent], records: Iterable[SampleRecord],
          dispatched: Mapping[str, str] | None = None) -> Reach:
    """Split the unfired server-side rules into not reached and never matched (see the module docstring)."""
    if plan is None:
        return Reach([], [])
    fired = {e.rule for e in fault_events}
    groups = dict(dispatched or {})
    lost = []
    for record in records:
        groups.setdefault(record.trajectory, record.group)
        if record.outcome == "lost":
            lost.append(record.trajectory)
    not_reached, never_matched = [], []
    for rule in plan.rules:
        if not rule.fault.server_side or rule.name in fired:
            continue
        unreached = any(_in_scope(rule, t, groups.get(t)) for t in lost)
        (not_reached if unreached else never_matched).append(rule.name)
    return Reach(not_reached, never_matched)


def check(view: RunView) -> list[Violation]:
    if view.plan is None:
        return []
    rules = {rule.name: rule for rule in view.plan.rules}
    never = reach(view.plan, view.fault_events, view.records, view.dispatched).never_matched
    return [Violation(NAME, None, f"rule {name!r} ({rules[name].fault.name}) never fired: the target ran its "
                                  f"scope to the end and the schedule matched nothing", {"rule": name})
            for name in never]
