"""Seed 003 on ref-scheduler: the router outage turns the unfixed scheduler into a retry storm; the
fixed one fails the batch fast with the root cause and still retries what is retryable."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bench import RunConfig, RunResult, run
from bench.invariants import Bounds
from bench.targets import resolve_target
from bench.targets.reference.scheduler import MAX_RESCHEDULES, ModelError, serialize_error, status_error
from faults import Plan, resolve_plan

# Two groups of four; seed-003's `rate-limited-once` (429 on a first attempt, p=1/20) hits
# g00018-1, g00019-2 and g00019-3 of the trace, so both of its rules fire on these eight.
TRAJECTORIES = [f"g000{g}-{m}" for g in (18, 19) for m in range(4)]
RATE_LIMITED = {"g00018-1", "g00019-2", "g00019-3"}
NO_WORKERS = "No available workers (all circuits open or unhealthy)"


def _run(target: str, plan: Plan) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=plan, target=target, trajectories=TRAJECTORIES, watchdog_s=5.0,
                       bounds=Bounds())
    return asyncio.run(run(config))


def _without_outage() -> Plan:
    """seed-003 minus its outage: the only way to see a retried 429 succeed, since every request in
    the first 10 s of server time (the whole test) lands in the outage window."""
    plan = resolve_plan("seed-003")
    return Plan(plan.name + "-without-outage", plan.seed, tuple(r for r in plan.rules if r.name != "router-outage"))


def test_variants_and_declared_policy() -> None:
    unfixed, fixed = resolve_target("ref-scheduler"), resolve_target("ref-scheduler:fixed")
    assert (unfixed.name, unfixed.fail_fast) == ("ref-scheduler:unfixed", False)
    assert (fixed.name, fixed.fail_fast) == ("ref-scheduler:fixed", True)
    from bench.targets import TargetError
    with pytest.raises(TargetError):
        resolve_target("ref-scheduler:other")


def test_errors_serialize_like_verifiers() -> None:
    body = (b'{"error":{"type":"Service Unavailable","code":"no_available_workers","message":"' + NO_WORKERS.encode()
            + b'"}}')
    for status, payload, retryable, cause in ((503, body, False, "InternalServerError"),
                                              (429, b"", True, "RateLimitError")):
        try:
            try:
                raise status_error(status, payload)
            except Exception as error:
                raise ModelError() from error
        except ModelError as error:
            info = serialize_error(error)
        assert info["error"] == "ModelError" and info["is_retryable"] is retryable
        assert info["error_chain_str"] == f"ModelError -> {cause}"
    assert info["error_chain_repr"] == "ModelError() -> RateLimitError('Error code: 429')"
    try:
        try:
            raise status_error(503, body)
        except Exception as error:
            raise ModelError() from error
    except ModelError as error:
        assert serialize_error(error)["error_chain_repr"] == f"ModelError() -> InternalServerError('{NO_WORKERS}')"


def test_unfixed_scheduler_storms_through_the_outage() -> None:
    result = _run("ref-scheduler:unfixed", resolve_plan("seed-003"))
    # every replacement group re-sends its four rollouts: 8 first requests, then 4 per replacement
    assert len(result.requests) == len(TRAJECTORIES) + 4 * MAX_RESCHEDULES
    assert Counter(r.status for r in result.requests) == {503: len(result.requests) - 3, 429: 3}
    assert result.batch_error is None and result.hang is None
    assert {r.outcome for r in result.records} == {"failed"}
    assert all(r.error and NO_WORKERS in r.error.message for r in result.records)
    assert {v.invariant for v in result.violations} == {"retry_discipline"}
    storms = {v.trajectory: v for v in result.violations if v.message.startswith("retry storm")}
    terminal = {v.trajectory: v for v in result.violations if v.message.startswith("kept retrying")}
    assert set(storms) == set(terminal) == set(TRAJECTORIES)
    per_trajectory = Counter(r.trajectory for r in result.requests)
    for trajectory, violation in storms.items():
        evidence = violation.evidence
        assert evidence["requests"] == per_trajectory[trajectory] > evidence["bound"] == 8
        assert evidence["failed_requests"] == evidence["requests"] and evidence["outcome"] == "failed"
        assert violation.fault is not None and violation.fault["fault"] == "outage"
    for trajectory, violation in terminal.items():
        evidence = violation.evidence
        first_attempt = 2 if trajectory in RATE_LIMITED else 1
        assert evidence["first_terminal"] == {"turn": 0, "attempt": first_attempt}
        assert evidence["requests_after_terminal"] == per_trajectory[trajectory] - first_attempt > evidence["bound"]
        assert evidence["terminal_answers"] == evidence["requests_after_terminal"] + 1
        assert evidence["statuses_after"] == {"503": evidence["requests_after_terminal"]}


def test_fixed_scheduler_fails_fast_with_the_root_cause() -> None:
    result = _run("ref-scheduler:fixed", resolve_plan("seed-003"))
    assert result.violations == []  # batch_survival accepts a fail-fast target raising its root cause
    error = result.batch_error
    assert error is not None and error.type == "RuntimeError"
    assert "non-retryable" in error.message and NO_WORKERS in error.message
    assert "ModelError() -> InternalServerError(" in error.message
    # one request per trajectory: the no-workers 503 is never retried
    assert sorted(r.trajectory for r in result.requests) == sorted(TRAJECTORIES)
    assert {e.rule for e in result.fault_events} == {"router-outage", "rate-limited-once"}
    failed = [r for r in result.records if r.outcome == "failed"]
    lost = [r for r in result.records if r.outcome == "lost"]
    assert len(failed) == 4 and len(lost) == 4 and len({r.group for r in failed}) == 1
    assert any(r.error and NO_WORKERS in r.error.message for r in failed)
    assert all(r.error and r.error.type == "RuntimeError" for r in lost)


def test_fixed_scheduler_still_retries_rate_limits() -> None:
    result = _run("ref-scheduler:fixed", _without_outage())
    assert result.violations == [] and result.batch_error is None
    assert {r.outcome for r in result.records} == {"completed"}
    by_attempt = {(r.trajectory, r.attempt): r.status for r in result.requests}
    for trajectory in RATE_LIMITED:
        assert by_attempt[(trajectory, 1)] == 429 and by_attempt[(trajectory, 2)] == 200
    # the replacement is the whole group: both groups ran twice, nothing ran a third time
    assert Counter(r.trajectory for r in result.requests) == {t: 2 for t in TRAJECTORIES}
    assert [e.trajectory for e in result.fault_events if e.attempt > 1] == []
