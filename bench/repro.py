"""Repro files: the smallest rerun that shows a run's first violation again.

A failing run writes `repro.toml`: trace, target, seed, the violated invariant, the
trajectories involved and the fault events that hit them, keyed by (trajectory, turn,
attempt). `rollout-bench run --repro repro.toml` turns each event into a rule that fires on
exactly that attempt and runs only those trajectories, so the violation comes back in seconds.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults import Plan, PlanError, make_rule
from faults.plan import toml_value

from .known import SHIPPED_DIR
from .runner import RunConfig, RunResult

GROUP_LEVEL = {"group_completeness", "batch_survival"}


def write_repro(result: RunResult, path: str | Path) -> Path | None:
    """Write the repro of the run's first violation; None when the run had none."""
    if not result.violations:
        return None
    first = result.violations[0]
    involved = {first.trajectory} if first.trajectory else set()
    if first.fault:
        involved.add(first.fault["trajectory"])
    if not involved:  # a run-level violation: every trajectory a fault hit
        involved = {e.trajectory for e in result.fault_events}
    plan = result.config.plan
    rules = {r.name: r for r in (plan.rules if plan else ())}
    events = [e for e in result.fault_events if e.trajectory in involved]
    lines = [
        "# rollout-bench repro: rerun with `rollout-bench run --repro <this file>`",
        f"trace = {toml_value(result.config.trace)}",
        f"target = {toml_value(result.config.target)}",
        f"target_options = {toml_value(result.config.target_options)}",
        f"isolation = {toml_value(result.config.isolation)}",
        f"seed = {plan.seed if plan else 0}",
        f"plan = {toml_value(plan.name if plan else 'none')}",
        f"invariant = {toml_value(first.invariant)}",
        f"message = {toml_value(first.message)}",
        f"trajectories = {toml_value(sorted(involved))}",
    ]
    if result.config.known:  # the same findings stay known in the rerun
        lines.append(f"known = {toml_value(_known_spec(result))}")
    for event in events:
        params = rules[event.rule].fault.describe() if event.rule in rules else {}
        lines += ["", "[[events]]", f"rule = {toml_value(event.rule)}", f"fault = {toml_value(event.fault)}",
                  f"trajectory = {toml_value(event.trajectory)}", f"turn = {event.turn}",
                  f"attempt = {event.attempt}", f"params = {toml_value(params)}"]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class Repro:
    config: RunConfig
    invariant: str


def _known_spec(result: RunResult) -> str:
    """A shipped file by its name (the repro moves between checkouts and installs), else its absolute path."""
    path = Path(result.known_file or str(result.config.known)).resolve()
    return path.stem if path.parent == SHIPPED_DIR.resolve() else str(path)


def load_repro(path: str | Path, **overrides: Any) -> Repro:
    """The run a repro file describes: its trajectories, with one exact rule per recorded event."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        rules = []
        for index, event in enumerate(data.get("events", [])):
            values = {"fault": event["fault"], "name": f"{event['rule']}@{index}", **event.get("params", {}),
                      "trajectories": [event["trajectory"]], "turns": [event["turn"]],
                      "attempts": [event["attempt"]]}
            rules.append(make_rule(values, values["name"]))
        plan = Plan(f"repro of {data['plan']}", int(data["seed"]), tuple(rules), f"repro: {data['invariant']}",
                    str(path))
        overrides = {"isolation": data.get("isolation", "process"),
                     "target_options": dict(data.get("target_options", {})), "known": data.get("known"), **overrides}
        config = RunConfig(trace=data["trace"], plan=plan, target=data["target"],
                           trajectories=list(data["trajectories"]), **overrides)
        return Repro(config, data["invariant"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as error:
        raise PlanError(f"{path}: not a usable repro file ({type(error).__name__}: {error})") from None
