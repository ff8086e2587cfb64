"""Vacuity: every server-side rule of the plan fired at least once (else the run proved nothing about it)."""

from __future__ import annotations

from .base import RunView, Violation

NAME = "vacuity"


def check(view: RunView) -> list[Violation]:
    if view.plan is None:
        return []
    fired = {e.rule for e in view.fault_events}
    return [Violation(NAME, None, f"rule {rule.name!r} ({rule.fault.name}) never fired", {"rule": rule.name})
            for rule in view.plan.rules if rule.fault.server_side and rule.name not in fired]
