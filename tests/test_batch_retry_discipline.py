"""retry_discipline over the whole batch: churn spread too thin for the per-trajectory checks.

At full size seed-003's outage makes ref-scheduler:unfixed replace 64 groups (the bench's cap):
every trajectory is sent at most three times, within the per-trajectory bounds, yet the batch
re-sends 256 requests into the dead router and finishes nothing. The fixed scheduler stops on
the first no-workers answer; a correct per-request retrier under heavy transient faults re-sends
much and finishes nearly everything. Both must stay clean.
"""

from __future__ import annotations

import asyncio

from bench import ErrorInfo, RunConfig, RunResult, SampleRecord, run
from bench.invariants import Bounds, RunView, check_all
from bench.invariants.churn import measure_churn
from bench.records.request_log import RequestRecord
from bench.targets.reference.scheduler import MAX_RESCHEDULES
from faults import FaultEvent, resolve_plan

GROUPS, SIZE = 125, 4  # rlvr-500


def _full(target: str, plan: str = "seed-003", **options) -> RunResult:  # type: ignore[no-untyped-def]
    # inline: the worker process changes nothing the invariant reads, and costs seconds per run
    return asyncio.run(run(RunConfig(trace="rlvr-500", plan=resolve_plan(plan), target=target, isolation="inline",
                                     **options)))


def _batch(result: RunResult) -> list:  # type: ignore[type-arg]
    return [v for v in result.violations if v.invariant == "retry_discipline" and v.trajectory is None]


def test_unfixed_scheduler_churns_the_full_batch() -> None:
    result = _full("ref-scheduler:unfixed")
    assert {r.outcome for r in result.records} == {"failed"} and result.batch_error is None
    # the gap this check closes: no trajectory breaks a per-trajectory bound
    assert [v for v in result.violations if v.trajectory is not None] == []
    [violation] = _batch(result)
    assert violation.message.startswith("batch retry storm: 256 re-sends (256 failed) for 0 turns of 0 finished")
    evidence = violation.evidence
    assert evidence["resends"] == evidence["failed_resends"] == SIZE * MAX_RESCHEDULES == len(result.requests) - 500
    assert evidence["resend_statuses"] == {"503": SIZE * MAX_RESCHEDULES}
    assert evidence["finished"] == evidence["finished_turns"] == 0 and evidence["requests_per_finished_sample"] is None
    assert (evidence["groups_reached"], evidence["replacement_rounds"], evidence["groups_finished"]) == (
        GROUPS, MAX_RESCHEDULES, 0)
    assert evidence["groups_started"] == GROUPS + MAX_RESCHEDULES
    assert evidence["allowed_resends"] == evidence["group_budget"] == SIZE * (Bounds().max_requests_per_trajectory - 1)


def test_fixed_scheduler_stops_without_churn() -> None:
    result = _full("ref-scheduler:fixed")
    assert result.batch_error is not None and result.batch_error.type == "RuntimeError"
    # fail-fast is batch_survival's business; if the stop came before any 429, that rule was not reached
    assert result.violations == []


def test_correct_retrier_under_heavy_transient_faults_is_clean() -> None:
    """Every fault of the chaos plan at ten times its rate (its most likely one at p = 1/5), against a client
    that retries transient errors: it re-sends a lot and finishes most."""
    plan = resolve_plan("chaos").scaled(10)
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=200, plan=plan, target="tests.discipline_targets:"
                                       "RetriesTransientErrors", isolation="inline",
                                       invariants=["retry_discipline"])))
    assert result.violations == []
    churn = measure_churn(_view(result.records, result.requests, batch_error=result.batch_error))
    assert churn.resends >= 20 and churn.resend_statuses.get("200", 0) >= 10  # it did retry, and retries succeeded
    assert churn.finished >= 120


def _view(records: list[SampleRecord], requests: list[RequestRecord], **kwargs) -> RunView:  # type: ignore[no-untyped-def]
    return RunView(records, requests, [], None, {r.trajectory: r.group for r in records}, 4096, False, **kwargs)


def _requests(trajectory: str, group: str, count: int, ok_last: bool) -> list[RequestRecord]:
    return [RequestRecord(0.0, "/generate", trajectory=trajectory, group=group, turn=0, attempt=i + 1,
                          status=200 if ok_last and i == count - 1 else 500, prompt_tokens=10) for i in range(count)]


def test_the_bound_is_per_finished_turn_plus_one_group() -> None:
    """Two groups of four: one finished (one turn each), one failed; 4 re-sends per finished turn (16)
    plus one group's per-trajectory budget (4 x 7 = 28) are allowed: 44 re-sends pass, 45 do not."""
    records = [SampleRecord(f"a-{i}", "a", "completed") for i in range(4)]
    records += [SampleRecord(f"b-{i}", "b", "failed") for i in range(4)]

    def requests(extra: int) -> list[RequestRecord]:
        out = [r for i in range(4) for r in _requests(f"a-{i}", "a", 1, ok_last=True)]
        # 44 + extra re-sends spread over the failed group: 11 or 12 per trajectory, within no bound of its own
        per = [11 + (1 if i < extra else 0) for i in range(4)]
        return out + [r for i in range(4) for r in _requests(f"b-{i}", "b", 1 + per[i], ok_last=False)]

    at_bound = _view(records, requests(0))
    assert measure_churn(at_bound).resends == 44
    assert [v for v in check_all(at_bound, ["retry_discipline"]) if v.trajectory is None] == []
    over = _view(records, requests(1))
    [violation] = [v for v in check_all(over, ["retry_discipline"]) if v.trajectory is None]
    assert violation.evidence["allowed_resends"] == 4 * 4 + 4 * 7 and violation.evidence["resends"] == 45
    assert violation.evidence["requests_per_finished_sample"] == round(53 / 4, 3)
    assert violation.evidence["groups_finished"] == 1 and violation.evidence["groups_reached"] == 2
    # the group allowance is made of the per-trajectory bound: raising that raises it (4 x 63)
    looser = _view(records, requests(1), bounds=Bounds(max_requests_per_trajectory=64))
    assert [v for v in check_all(looser, ["retry_discipline"]) if v.trajectory is None] == []


def test_a_raised_batch_leaves_its_lost_trajectories_out() -> None:
    """What a batch that raised had in flight is the stop's evidence, not churn; without the raise it counts."""
    records = [SampleRecord(f"b-{i}", "b", "lost") for i in range(4)]
    requests = [r for i in range(4) for r in _requests(f"b-{i}", "b", 10, ok_last=False)]  # 36 re-sends
    crashed = _view(records, requests, batch_error=ErrorInfo("RuntimeError", "stop", ""))
    assert measure_churn(crashed).resends == 0
    assert [v for v in check_all(crashed, ["retry_discipline"]) if v.trajectory is None] == []
    returned = _view(records, requests)
    assert measure_churn(returned).resends == 36
    assert [v.evidence["resends"] for v in check_all(returned, ["retry_discipline"]) if v.trajectory is None] == [36]


def _outage(trajectory: str, turn: int, attempt: int) -> FaultEvent:
    return FaultEvent("router-outage", "outage", trajectory, "m", turn, attempt, "/generate", "", 0.0, "503")


def test_a_multi_turn_trajectory_that_got_through_an_outage_is_not_retrying_into_it() -> None:
    """One 503 "No available workers", a retry that succeeds, then ten more turns: the later turns are the
    conversation going on, not retries into a dead fleet (AReaL's agent through seed-003's outage). The same
    trajectory retrying three times into the outage without a success is the terminal violation."""
    records = [SampleRecord("m-0", "m", "completed")]
    turns = [RequestRecord(0.0, "/generate", trajectory="m-0", group="m", turn=t, attempt=1, status=200,
                           prompt_tokens=100 + t) for t in range(1, 11)]

    def view(statuses: list[int]) -> RunView:
        first = [RequestRecord(0.0, "/generate", trajectory="m-0", group="m", turn=0, attempt=i + 1, status=s,
                               prompt_tokens=10) for i, s in enumerate(statuses)]
        events = [_outage("m-0", 0, i + 1) for i, s in enumerate(statuses) if s == 503]
        return RunView(records, first + (turns if statuses[-1] == 200 else []), events, None, {"m-0": "m"}, 4096,
                       False)

    assert check_all(view([503, 200]), ["retry_discipline"]) == []
    assert check_all(view([503, 503, 200]), ["retry_discipline"]) == []  # two after it: the bound
    [violation] = check_all(view([503, 503, 503, 503]), ["retry_discipline"])
    assert violation.message.startswith("kept retrying a terminal error: 3 requests after")
    assert violation.evidence["terminal_answers"] == 4 and violation.evidence["requests_after_terminal"] == 3
