"""Is a failure carried over? Run the failed step's inputs again, alone, in a fresh process, and compare.

A `step_carryover` finding says a step failed after an earlier step had failed, with no injected fault to
explain it. What the earlier failure left behind is then the first suspect, not the proof: the step might fail on
its own inputs. So the bench reruns that step's trajectories under that step's rules as a one-step run in a new
worker (`bench.orchestration.runner.run`, the same target, interpreter and options), and the finding says
which it was: it passes there (carried over: the process, not the inputs, made it fail), or it fails there too
(the step's own failure, still a failure on a valid reply).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bench.invariants.base import Violation
from faults import Plan

from .board import StepBoard


def plan_as_one_step(plan: Plan | None, step: int) -> Plan | None:
    """The rules in force during `step`, each without its `steps`, for a one-step rerun of that step."""
    if plan is None:
        return None
    rules = tuple(dataclasses.replace(rule, schedule=dataclasses.replace(rule.schedule, steps=None))
                  for rule in plan.rules if rule.schedule.steps is None or step in rule.schedule.steps)
    return dataclasses.replace(plan, rules=rules, name=f"{plan.name} (step {step})")


async def confirm(config: Any, board: StepBoard, violations: list[Violation]) -> list[Violation]:
    """Each `step_carryover` finding with its fresh-process rerun in its evidence and message."""
    from bench.orchestration.runner import run  # the runner calls this: imported when needed, not at load

    out = []
    for violation in violations:
        if violation.invariant != "step_carryover":
            out.append(violation)
            continue
        step = int(violation.evidence["step"])
        ids = [t for t, s in board.step_of.items() if s == step]
        rerun = await run(dataclasses.replace(config, steps=1, n=None, trajectories=ids,
                                              plan=plan_as_one_step(config.plan, step)))
        error = rerun.batch_error
        fresh: dict[str, Any] = {"trajectories": len(ids), "outcomes": _outcomes(rerun.records),
                                 "error": None if error is None else f"{error.type}: {error.message[:300]}",
                                 "worker_pid": (rerun.worker or {}).get("pid")}
        if error is None and rerun.hang is None:
            fresh["verdict"] = "passes in a fresh process: carried over"
        else:
            fresh["verdict"] = "fails in a fresh process too: the step's own failure, not carried over"
        out.append(dataclasses.replace(violation, message=f"{violation.message}; {fresh['verdict']}",
                                       evidence={**violation.evidence, "fresh_process": fresh}))
    return out


def _outcomes(records: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.outcome] = counts.get(record.outcome, 0) + 1
    return counts
