"""Sweeps: many runs over a grid of targets, plans, rates and seeds (`sweeper`), the grid (`grid`), and the
table of their outcomes (`table`).

Deprecated: the functions of the former `bench.sweep` module from here; they live in `bench.sweep.sweeper`.
"""

from __future__ import annotations

from typing import Any

from bench._moved import moved_attribute

_MOVED = {name: "bench.sweep.sweeper" for name in ("SweepOptions", "default_jobs", "kill_tree", "run_command",
                                                     "run_point", "run_sweep", "sweep_command", "sweep_invariants")}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name, _MOVED)
