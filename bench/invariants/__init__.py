"""Invariants: pure checks over a run's records and logs, one module each."""

from __future__ import annotations

from types import ModuleType

from . import (abort_contract, accounting, batch_survival, context_budget, group_completeness, liveness,
               replay_fidelity, retry_discipline, staleness, token_alignment, vacuity)
from .base import Bounds, HangReport, RunView, Violation

_MODULES: list[ModuleType] = [token_alignment, context_budget, abort_contract, batch_survival, group_completeness,
                              staleness, retry_discipline, liveness, accounting, vacuity, replay_fidelity]
INVARIANTS = {module.NAME: module.check for module in _MODULES}


def check_all(view: RunView, only: list[str] | None = None) -> list[Violation]:
    """Run the selected invariants (all by default), in a fixed order."""
    names = list(INVARIANTS) if only is None else only
    unknown = [n for n in names if n not in INVARIANTS]
    if unknown:
        raise ValueError(f"unknown invariants {', '.join(unknown)}; valid: {', '.join(INVARIANTS)}")
    return [v for name in names for v in INVARIANTS[name](view)]


__all__ = ["Bounds", "HangReport", "INVARIANTS", "RunView", "Violation", "check_all"]
