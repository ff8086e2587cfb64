"""The cross-step checks on a rollout that generates ahead (AReaL's `prepare_batch`) and a trainer whose weight
sync names no version (AReaL's): built step states, no worker (the real runs are `tests/test_steps_areal.py`)."""

from __future__ import annotations

from bench.records.request_log import RequestRecord
from bench.steps.board import ADAPTER, StepBoard, StepState
from bench.records.sample import ErrorInfo, SampleRecord
from bench.steps.checks import carryover, lag_bound, late_requests, weights_not_served
from faults import FaultEvent
from bench.steps.table import step_rows


def _board(*states: StepState) -> StepBoard:
    board = StepBoard(None, None, len(states), {"t0": 0, "t1": 1, "t2": 2})
    board.states = list(states)
    return board


def _steps() -> tuple[StepState, StepState, StepState]:
    """Steps 0, 1, 2 beginning at 0, 10, 20 and returning at 9, 19, 29."""
    return tuple(StepState(k, 10.0 * k, "0", began=10.0 * k, returned=10.0 * k + 9,  # type: ignore[return-value]
                           published_by=ADAPTER, trainer_version=str(k)) for k in range(3))


def test_a_trajectory_generating_on_until_the_step_that_takes_it_is_not_late() -> None:
    board = _board(*_steps())
    during_step_1 = [RequestRecord(15.0, "/generate", trajectory="t0")]  # t0 is step 0's, still generating
    assert [v.invariant for v in late_requests(board, during_step_1)] == ["step_late_requests"]  # synchronous
    assert late_requests(board, during_step_1, consumed={"t0": 1}) == []  # handed over in step 1: in time
    after_its_step = [RequestRecord(25.0, "/generate", trajectory="t0")]  # once step 2 had begun
    late = late_requests(board, after_its_step, consumed={"t0": 1})
    assert [(v.evidence["step"], v.evidence["during_steps"]) for v in late] == [(1, [2])]


def test_an_update_naming_no_version_counts_as_the_sync_only_when_the_server_applied_it() -> None:
    steps = _steps()
    board = _board(*steps)
    assert [v.evidence["step"] for v in weights_not_served(board, [])] == [1, 2]  # the label stayed at 0
    for state in steps[1:]:
        state.applied_updates.append({"endpoint": "/update_weights_from_distributed", "weight_version": None,
                                      "at": state.began - 1})
    # an adapter whose syncs name their version (slime, miles): one that names none is the regression
    assert [v.evidence["step"] for v in weights_not_served(board, [])] == [1, 2]
    for state in steps:
        state.versionless_sync = True  # the adapter declares versionless syncs (AReaL, verl)
    assert weights_not_served(board, []) == []
    steps[2].applied_updates.clear()  # held: answered, not applied (`StepBoard.hold` records it elsewhere)
    steps[2].ignored_updates.append({"endpoint": "/update_weights_from_distributed", "weight_version": None,
                                     "at": steps[2].began - 1})
    assert [v.evidence["step"] for v in weights_not_served(board, [])] == [2]
    steps[1].applied_updates[0]["at"] = steps[1].began + 1  # applied only once the step's rollout had begun
    assert [v.evidence["step"] for v in weights_not_served(board, [])] == [1, 2]


class _Server:
    """The part of the server's context the lag check reads: its weight-version history."""

    def __init__(self, *changes: tuple[float, str]) -> None:
        from bench.server.state import ServerState

        self.state = ServerState("0")
        self.state.version_history.clear()
        self.state.version_history.extend(changes)


def _trained(version: str, handed_over_at: float | None, trajectory: str = "t1") -> SampleRecord:
    return SampleRecord(trajectory, "g", "completed", weight_versions=[version], step=1,
                        handed_over_at=handed_over_at, details={"training_step": 6})


def test_a_sample_is_judged_against_the_weights_it_was_trained_against_inside_a_step() -> None:
    """One bench step holding several training steps (open-instruct): the trainer published v3 before the step and
    synced v4, v5, v6 during it; a sample served v3 and handed over once v6 was on the server lags 3, not 0."""
    steps = _steps()
    board = _board(*steps)
    board.context = _Server((0.0, "0"), (10.0, "3"), (12.0, "4"), (14.0, "5"), (16.0, "6"))
    steps[1].trainer_version = "3"
    late = lag_bound(board, [_trained("3", 17.0)], {"t1": 1}, bound=1)
    assert [(v.invariant, v.evidence["max_lag"], v.evidence["samples"][0]["trained_against"]) for v in late] == [
        ("step_lag", 3, 6)]
    assert lag_bound(board, [_trained("3", 12.5)], {"t1": 1}, bound=1) == []  # handed over under v4: lag 1
    assert step_rows(board, [_trained("3", 17.0)], [], {"t1": 1})[1]["max_lag"] == 3


def test_a_sync_naming_no_version_leaves_the_step_trainer_s_version_to_judge_by() -> None:
    """AReaL, verl: the server's label never moves (v0 throughout); the step's trainer version (v2) stands."""
    steps = _steps()
    board = _board(*steps)
    board.context = _Server((0.0, "0"))
    late = lag_bound(board, [_trained("0", 25.0, "t2")], {"t2": 2}, bound=1)
    assert [(v.evidence["max_lag"], v.evidence["samples"][0]["trained_against"]) for v in late] == [(2, 2)]
    assert lag_bound(board, [_trained("1", 25.0, "t2")], {"t2": 2}, bound=1) == []


def _poison(trajectory: str, at: float) -> FaultEvent:
    return FaultEvent("poison", "malformed_json", trajectory, "g", 0, 1, "/generate", "r1", at, "garbled",
                      reach="consumed")


def test_a_fresh_fault_on_a_trajectory_generated_ahead_explains_its_step_s_failure() -> None:
    """Step 1 timed out naming no trajectory; step 2 failed on t_b, a slice-1 trajectory the rollout generated
    ahead into step 2, after a poison that fired on it during step 2: that fault explains it, wherever t_b's
    slice is."""
    steps = _steps()
    steps[1].error = ErrorInfo("TimeoutError", "timed out", "")
    steps[2].error = ErrorInfo("ValueError", "unparsable reply", "", "t_b")
    board = _board(*steps)
    board.step_of.update(t_b=1)
    assert carryover(board.states, [_poison("t_b", 25.0)]) == []
    found = carryover(board.states, [_poison("t_b", 15.0)])  # fired in step 1: nothing fired on t_b in step 2
    assert [(v.evidence["step"], v.evidence["repeats_step"]) for v in found] == [(2, None)]


def test_an_earlier_step_s_error_raised_again_is_carried_over_despite_its_fault() -> None:
    """A dead gather thread (open-instruct) re-raises step 1's exception, on step 1's trajectory, in step 2; a fault
    firing on that trajectory again in step 2 does not explain a repeat of step 1's error."""
    steps = _steps()
    steps[1].error = ErrorInfo("InjectedFault", "raise_after_generate", "", "t1")
    steps[2].error = ErrorInfo("InjectedFault", "raise_after_generate", "", "t1")
    found = carryover(_board(*steps).states, [_poison("t1", 15.0), _poison("t1", 25.0)])
    assert [(v.evidence["step"], v.evidence["after_step"], v.evidence["repeats_step"]) for v in found] == [(2, 1, 1)]
    steps[2].error = ErrorInfo("InjectedFault", "raise_after_generate (again)", "", "t1")  # a new error: explained
    assert carryover(_board(*steps).states, [_poison("t1", 15.0), _poison("t1", 25.0)]) == []
