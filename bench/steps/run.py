"""The runner's side of a multi-step run: which trajectories each step gets, the board the server keeps, and what
the run's records and findings say per step once it ended (`bench.orchestration.runner` calls these)."""

from __future__ import annotations

from typing import Any, Sequence

from bench.invariants.base import Violation
from bench.records.request_log import RequestRecord
from bench.records.sample import ErrorInfo, SampleRecord
from faults import FaultEvent, Plan

from . import STEP_FAILURE_POLICIES
from .board import StepBoard, plan_for_step, plan_for_steps
from .checks import check_steps, lag_bound
from .fresh import compare_later_step
from .fresh import confirm as confirm_in_fresh_process
from .table import step_rows


class StepsError(ValueError):
    """A multi-step run that cannot be sliced as asked (names the arguments and the trace)."""


def check_step_arguments(steps: int, on_step_failure: str, compare_fresh: bool = False) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: a run needs at least 1 step")
    if compare_fresh and steps < 2:
        raise ValueError("compare_fresh needs steps >= 2: it compares a later step with a fresh process")
    if on_step_failure not in STEP_FAILURE_POLICIES:
        raise ValueError(f"on_step_failure={on_step_failure!r}: one of {', '.join(STEP_FAILURE_POLICIES)}")


def select(chosen: Sequence[Any], n: int | None, steps: int, trace: str) -> list[Any]:
    """The trajectories of all steps, in order: step k gets the k-th slice of `n` (default: the trace split in
    `steps` equal slices). A trace too short for `steps` x `n`, or a slice boundary inside a group, is refused."""
    if steps == 1:
        return list(chosen[:n] if n is not None else chosen)
    size = n if n is not None else len(chosen) // steps
    if size < 1 or size * steps > len(chosen):
        raise StepsError(f"--steps {steps}: each step takes the next {size if n is not None else '--n'} "
                         f"trajectories of the trace ({steps} x {size} = {steps * size}), but {trace} has "
                         f"{len(chosen)}{'' if n is not None else ' (fewer than one per step)'}; use a smaller --n "
                         f"or --steps, or a longer trace")
    selected = list(chosen[: size * steps])
    for step in range(1, steps):
        before, after = selected[step * size - 1], selected[step * size]
        if before.group_id == after.group_id:
            raise StepsError(f"--steps {steps} --n {size}: step {step - 1}'s last trajectory ({before.id}) and step "
                             f"{step}'s first ({after.id}) are in one group ({before.group_id}): a group would be "
                             f"split across two steps; use an --n that is a multiple of the group size")
    return selected


def start(context: Any, plan: Plan | None, trajectory_ids: list[str], steps: int) -> StepBoard | None:
    """Before the job goes out: a board for a multi-step run (its step 0 begun), else the plan's step-0 rules."""
    if steps == 1:
        step_plan = plan_for_step(plan, 0)
        if step_plan is not None and step_plan is not context.faults.plan:
            context.faults.swap(step_plan)  # a rule for steps a one-step run never has: not in its plan
        return None
    size = len(trajectory_ids) // steps
    board = StepBoard(context, plan, steps, {t: i // size for i, t in enumerate(trajectory_ids)})
    context.steps = board
    board.begin(0)
    return board


def ran_ids(board: StepBoard | None, trajectory_ids: list[str]) -> set[str]:
    """The trajectories of the steps that started (a run stopped after a failed step never dispatched the rest)."""
    if board is None:
        return set(trajectory_ids)
    return {t for t in trajectory_ids if board.step_of[t] < board.ran()}


def loss_cause(board: StepBoard, trajectory: str, stall: ErrorInfo | None) -> ErrorInfo:
    """Why a trajectory of a multi-step run never came back: its step's error, else the stall that ended the run."""
    state = board.states[board.step_of[trajectory]]
    if state.error is not None:
        if state.error.trajectory == trajectory:
            return state.error
        return ErrorInfo(state.error.type, state.error.message, "", state.error.trajectory)
    if stall is not None and not state.ended:
        return stall
    return ErrorInfo("Missing", f"step {state.step}'s rollout returned no record for it", "")


def view_plan(board: StepBoard | None, plan: Plan | None) -> Plan | None:
    """The plan the run is judged on: only rules for steps that ran (a rule for a later step was never reached)."""
    return plan_for_steps(plan, range(board.ran() if board is not None else 1))


def finish(board: StepBoard, records: list[SampleRecord], requests: list[RequestRecord],
           fault_events: list[FaultEvent], policy: str, max_lag: int | None = None) -> tuple[list[Violation],
                                                                                          dict[str, Any]]:
    """Stamp each record with its step; the cross-step findings and the report's `steps` block. A record the
    worker handed over came stamped with the step that trained on it (`loop.run_steps`): that step's weights
    are what its lag is judged against (`max_lag`: the run's bound, the framework's declared one if wider)."""
    consumed = {r.trajectory: r.step for r in records if r.outcome != "lost"}
    for record in records:
        record.step = board.step_of.get(record.trajectory, 0)
    violations = check_steps(board, requests, fault_events, consumed)
    if max_lag is not None:
        violations += lag_bound(board, records, consumed, max_lag)
    summary = {"steps": board.steps, "ran": board.ran(), "on_step_failure": policy,
               "rows": step_rows(board, records, requests, consumed)}
    return violations, summary


def first_violation(board: StepBoard, violations: list[Violation]) -> dict[str, Any] | None:
    """The earliest step a finding points at (its `first_step`, else its trajectory's step) and what it was."""
    def step_of(violation: Violation) -> int | None:
        if "first_step" in violation.evidence:
            return int(violation.evidence["first_step"])
        return board.step_of.get(violation.trajectory or "")

    placed = [(step, index, v) for index, v in enumerate(violations) if (step := step_of(v)) is not None]
    if not placed:
        return None if not violations else {"step": None, "invariant": violations[0].invariant,
                                            "message": violations[0].message[:300]}
    step, _, violation = min(placed, key=lambda item: (item[0], item[1]))
    return {"step": step, "invariant": violation.invariant, "message": violation.message[:300]}


async def compare_with_fresh_process(config: Any, board: StepBoard, records: list[SampleRecord],
                                     table: dict[str, Any]) -> list[Violation]:
    """`compare_fresh`: the last clean step against a fresh worker's run of it; the comparison goes in the
    report's `steps` block (`fresh_comparison`), agreeing or not."""
    found, comparison = await compare_later_step(config, board, records)
    table["fresh_comparison"] = comparison
    return found
