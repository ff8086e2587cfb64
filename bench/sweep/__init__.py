"""Sweeps: many runs over a grid of targets, plans, rates and seeds (`sweeper`), the grid (`grid`), and the
table of their outcomes (`table`). `run_sweep` and `sweep_command` are the entry points."""

from __future__ import annotations

from .sweeper import SweepOptions, default_jobs, run_sweep, sweep_command, sweep_invariants

__all__ = ["SweepOptions", "default_jobs", "run_sweep", "sweep_command", "sweep_invariants"]
