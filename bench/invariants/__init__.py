"""Invariants: pure checks over a run's records and logs, one module each."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

from . import (abort_contract, accounting, batch_survival, context_budget, group_completeness, liveness,
               provenance, replay_fidelity, retry_discipline, staleness, token_alignment, vacuity)
from .base import Bounds, HangReport, RunView, Violation

_MODULES: list[ModuleType] = [token_alignment, provenance, context_budget, abort_contract, batch_survival,
                              group_completeness, staleness, retry_discipline, liveness, accounting, vacuity,
                              replay_fidelity]
INVARIANTS = {module.NAME: module.check for module in _MODULES}


def check_all(view: RunView, only: list[str] | None = None) -> list[Violation]:
    """Run the selected invariants (all by default), in a fixed order."""
    names = list(INVARIANTS) if only is None else only
    unknown = [n for n in names if n not in INVARIANTS]
    if unknown:
        raise ValueError(f"unknown invariants {', '.join(unknown)}; valid: {', '.join(INVARIANTS)}")
    return per_trajectory([v for name in names for v in INVARIANTS[name](view)])


def per_trajectory(violations: list[Violation]) -> list[Violation]:
    """One violation per invariant, trajectory and check (the first found, with how many times it was found):
    a check that fires once per request must not bury eight trajectories under 476 lines. Two checks of one
    invariant (a retry storm, retrying a terminal error) stay apart: their evidence has other keys.
    Run-level violations (no trajectory) are merged only when they say the same thing."""
    merged: dict[tuple[str, str, tuple[str, ...]], Violation] = {}
    counts: dict[tuple[str, str, tuple[str, ...]], int] = {}
    for violation in violations:
        key = (violation.invariant, violation.trajectory if violation.trajectory is not None else
               f"run:{violation.message}", tuple(sorted(violation.evidence)))
        merged.setdefault(key, violation)
        counts[key] = counts.get(key, 0) + violation.occurrences
    return [replace(first, occurrences=counts[key]) if counts[key] != first.occurrences else first
            for key, first in merged.items()]


__all__ = ["Bounds", "HangReport", "INVARIANTS", "RunView", "Violation", "check_all", "per_trajectory"]
