"""Fault catalogue, schedules and plan files; `faults/plans/` holds the shipped plans.

Empty until the fault engine lands: the package exists so the layout, packaging and wheel
data lookups are settled from the start.
"""
