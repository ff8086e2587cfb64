"""Faults: catalogue, schedules, plans and the fault log (see `faults/plans/` for shipped plans).

A fault rule is what goes wrong (a fault type from the catalogue, with parameters), when
(a schedule: probability, every k-th trajectory, first n attempts, turns, trajectories,
groups, attempts, time window, endpoints) and where (endpoints). A plan is named rules plus
a seed; every decision is a pure function of (seed, rule, trajectory, turn, attempt).
"""

from .base import FAULTS, Fault, FaultError, alters_reply, fault_class, register
from .engine import FAULT_HEADER, FaultEngine, forced_rules
from .exchange import Exchange, Replacement, Transport
from .log import FaultEvent, FaultLog
from .plan import Plan, PlanError, Rule, load_plan, make_rule, plan_from_specs, resolve_plan, rule_from_spec, shipped_plans
from .schedule import Schedule, Target, parse_schedule

__all__ = [
    "FAULTS", "FAULT_HEADER", "Exchange", "Fault", "FaultEngine", "FaultError", "FaultEvent", "FaultLog", "Plan",
    "PlanError", "Replacement", "Rule", "Schedule", "Target", "Transport", "alters_reply", "fault_class", "forced_rules",
    "load_plan", "make_rule", "parse_schedule", "plan_from_specs", "register", "resolve_plan", "rule_from_spec",
    "shipped_plans",
]
