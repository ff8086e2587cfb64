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
        rerun = await run(dataclasses.replace(config, steps=1, n=None, trajectories=ids, compare_fresh=False,
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


FRESH_CHECK = "step_fresh_process"
_LISTED = 5


def compared_step(board: StepBoard) -> int | None:
    """The step a fresh process is compared on: the last one that ran to its end without raising, after step 0
    (step 0 runs in a process nothing ran in before: it is the fresh run)."""
    clean = [s.step for s in board.states if s.ended and s.error is None and s.step > 0]
    return clean[-1] if clean else None


def _deterministic(record: Any) -> dict[str, Any]:
    """What the same inputs must give again whatever ran before in the process (weight versions, timings and
    request ids are the run's own)."""
    return {"outcome": record.outcome, "response_ids": list(record.response_ids),
            "turns": len(record.request_ids), "error_type": record.error.type if record.error else None}


def _difference(trajectory: str, here: dict[str, Any], fresh: dict[str, Any] | None) -> dict[str, Any]:
    if fresh is None:
        return {"trajectory": trajectory, "missing_in_fresh_process": True}
    out: dict[str, Any] = {"trajectory": trajectory}
    for key in ("outcome", "turns", "error_type"):
        if here[key] != fresh[key]:
            out[key] = {"in_step": here[key], "fresh": fresh[key]}
    ids, fresh_ids = here["response_ids"], fresh["response_ids"]
    if ids != fresh_ids:
        first = next((i for i, (a, b) in enumerate(zip(ids, fresh_ids)) if a != b), min(len(ids), len(fresh_ids)))
        out["response_ids"] = {"in_step_length": len(ids), "fresh_length": len(fresh_ids), "first_difference": first}
    return out


async def compare_later_step(config: Any, board: StepBoard, records: list[Any]) -> tuple[list[Violation],
                                                                                          dict[str, Any]]:
    """Rerun a later step's trajectories, under that step's rules, as a one-step run in a fresh worker and compare
    what is deterministic per trajectory (outcome, response token ids, turns, error type). A difference is what
    the earlier steps left in the process changing results without raising. Returns the finding (if any) and
    the comparison for the report's `steps` block (it is there when the results agree, too)."""
    from bench.orchestration.runner import run

    step = compared_step(board)
    if step is None:
        return [], {"step": None, "note": "no step after step 0 ran to its end without raising: nothing compared"}
    ids = [t for t, s in board.step_of.items() if s == step]
    rerun = await run(dataclasses.replace(config, steps=1, n=None, trajectories=ids, compare_fresh=False,
                                          plan=plan_as_one_step(config.plan, step)))
    here = {r.trajectory: _deterministic(r) for r in records if r.trajectory in set(ids)}
    fresh = {r.trajectory: _deterministic(r) for r in rerun.records}
    differ = [_difference(t, here[t], fresh.get(t)) for t in ids if here.get(t) != fresh.get(t)]
    summary = {"step": step, "trajectories": len(ids), "differ": len(differ),
               "outcomes_in_step": _outcomes([r for r in records if r.trajectory in set(ids)]),
               "outcomes_fresh": _outcomes(rerun.records), "worker_pid": (rerun.worker or {}).get("pid")}
    if not differ:
        return [], summary
    state = board.states[step]
    held = {str(s.step): None if s.resources is None else {k: s.resources.get(k) for k in ("tasks", "threads",
                                                                                         "sockets", "fds")}
            for s in board.states if s.step <= step}
    return [Violation(
        FRESH_CHECK, differ[0]["trajectory"],
        f"step {step} gave other results than a fresh process on the same inputs and rules: {len(differ)} of "
        f"{len(ids)} trajectories differ (outcomes {summary['outcomes_in_step']} in the run, "
        f"{summary['outcomes_fresh']} fresh); what steps 0-{step - 1} left in the process changed them without "
        f"raising", {"check": "fresh_process", "step": step, "first_step": step, "differ": differ[:_LISTED],
                     "count": len(differ), "weight_version": state.weight_version, "held_after": held,
                     "fresh_process": summary}, occurrences=len(differ))], summary
