"""The grid of a fault-rate sweep: parsing its options, and the plan each grid point runs.

A *rate* r rescales a plan's probability rules (those with a `p`) so that the most likely one
fires with probability r and the others keep their ratio to it: a one-rule plan such as
seed-000 gets exactly `p = r`; `chaos` keeps its mix of faults, only louder or quieter.
Rules without `p` (every k-th trajectory, turns, windows, always-on rules) are left alone:
they describe *which* requests a fault hits, not how often. Rate 0 removes the probability
rules (a rule that never fires; plan files cannot say `p = 0`). A plan with no probability
rule cannot be swept. The grid point's seed replaces the plan's own.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from bench.targets import TargetError, check_target_spec
from faults import Plan, PlanError, Rule, resolve_plan
from faults.plan import plan_to_toml


class SweepError(ValueError):
    """A sweep option that cannot be run; the message names the option."""


def split_list(option: str, text: str) -> list[str]:
    """`a,b,c` -> ['a', 'b', 'c']; an empty list or item is an error naming the option."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise SweepError(f"{option} {text!r}: expected a comma-separated list with no empty items")
    return items


def parse_rates(text: str) -> list[Fraction]:
    """`0.01,1/400` -> exact fractions, each in [0, 1]."""
    rates = []
    for item in split_list("--rates", text):
        try:
            rate = Fraction(item)
        except (ValueError, ZeroDivisionError):
            raise SweepError(f"--rates {text!r}: {item!r} is not a number (write 0.01 or 1/400)") from None
        if not 0 <= rate <= 1:
            raise SweepError(f"--rates {text!r}: rate {item} is outside [0, 1] (it is a probability)")
        rates.append(rate)
    return list(dict.fromkeys(rates))


def parse_seeds(text: str) -> list[int]:
    seeds = []
    for item in split_list("--seeds", text):
        try:
            seeds.append(int(item))
        except ValueError:
            raise SweepError(f"--seeds {text!r}: {item!r} is not an integer") from None
    return list(dict.fromkeys(seeds))


def parse_plans(text: str) -> list[Plan]:
    plans = []
    for item in split_list("--plan", text):
        try:
            plan = resolve_plan(item)
        except PlanError as error:
            raise SweepError(f"--plan: {error}") from None
        if not any(rule.schedule.p is not None for rule in plan.rules):
            raise SweepError(f"--plan {item!r}: no rule has a probability `p`, so a fault rate cannot change it")
        plans.append(plan)
    return plans


def parse_targets(text: str) -> list[str]:
    """Target specs, checked without importing them (a target may live in another interpreter's venv)."""
    targets = split_list("--target", text)
    for spec in targets:
        try:
            check_target_spec(spec)
        except TargetError as error:
            raise SweepError(f"--target: {error}") from None
    return list(dict.fromkeys(targets))


def at_rate(plan: Plan, rate: Fraction) -> Plan:
    """The plan with its probability rules rescaled so the most likely fires with probability `rate`."""
    highest = max(rule.schedule.p for rule in plan.rules if rule.schedule.p is not None)  # type: ignore[type-var]
    if rate == 0:
        rules = tuple(rule for rule in plan.rules if rule.schedule.p is None)
    else:
        factor = rate / highest
        rules = tuple(rule if rule.schedule.p is None else
                      Rule(rule.name, rule.fault, dataclasses.replace(rule.schedule, p=rule.schedule.p * factor))
                      for rule in plan.rules)
    description = f"{plan.description} [sweep: probability rules rescaled to rate {rate}]".strip()
    return Plan(plan.name, plan.seed, rules, description, plan.source, plan.window_from)


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: a plan at a rate and seed, against a target."""

    index: int
    plan: Plan  # already at `rate`, with `seed`
    plan_name: str
    target: str
    rate: Fraction
    seed: int

    @property
    def id(self) -> str:
        """The run's folder name: its index first, so listings sort in grid order."""
        raw = f"{self.index:03d}-{self.plan_name}-{self.target}-r{float(self.rate):g}-s{self.seed}"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def build_grid(plans: list[Plan], targets: list[str], rates: list[Fraction], seeds: list[int]) -> list[GridPoint]:
    """Every (plan, target, rate, seed), in that nesting order."""
    points = []
    for plan in plans:
        for target in targets:
            for rate in rates:
                for seed in seeds:
                    points.append(GridPoint(len(points), at_rate(plan, rate).with_seed(seed), plan.name, target,
                                            rate, seed))
    return points


def write_plan(plan: Plan, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan_to_toml(plan), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Shard:
    """Part K of N of a grid (`--shard K/N`): the points whose index is K-1 modulo N. Interleaved, not
    contiguous, so every shard gets its share of each plan and target (they differ in cost)."""

    k: int
    n: int

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"

    def select(self, points: list[GridPoint]) -> list[GridPoint]:
        return [point for point in points if point.index % self.n == self.k - 1]


def parse_shard(text: str) -> Shard:
    """`2/4` -> Shard(2, 4): K from 1 to N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise SweepError(f"--shard {text!r}: expected K/N, e.g. 2/4 (part 2 of 4)")
    k, n = int(match[1]), int(match[2])
    if not 1 <= k <= n:
        raise SweepError(f"--shard {text!r}: K must be from 1 to N")
    return Shard(k, n)
