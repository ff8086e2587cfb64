"""The `verifiers` target: real verifiers 0.1.14 (with openai 2.36.0) in its own environment, run by the
worker against the bench's OpenAI route; seed 003 on it (router outage versus a retryable empty reply).

Skipped only when the verifiers environment is absent (`make targets` builds it). Each scenario is
one worker run over two groups of four, shared by the tests that read it. Retries by the OpenAI SDK
are set to one (`max_retries=1`) so its retry shows in the request counts without slowing the runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from bench import RunConfig, RunResult, SampleRecord, run
from bench.invariants import Bounds
from bench.targets import TargetError, resolve_target
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.verifiers.records import assemble
from bench.targets.reference.scheduler import reschedules
from bench.trace import Trajectory, open_trace
from bench.trace.shipped import shipped_trace
from faults import Plan, plan_from_specs, resolve_plan
from faults.plan import make_rule

NO_WORKERS = "No available workers (all circuits open or unhealthy)"
# What prime-rl#2579 quotes: the router's text/plain answer (sglang-router 0.2.x), through the real SDK.
SEED_CHAIN = f"ModelError() -> InternalServerError('{NO_WORKERS}')"
EMPTY = "EmptyModelResponseError('Model returned no content, reasoning, and did not call any tools')"
RLVR = [f"g0000{g}-{m}" for g in (0, 1) for m in range(4)]
SEED_003 = [f"g000{g}-{m}" for g in (18, 19) for m in range(4)]  # seed-003's 429 hits g00018-1, g00019-2/-3
RATE_LIMITED = {"g00018-1", "g00019-2", "g00019-3"}
AGENTIC = ["g00008-0", "g00008-1", "g00008-2", "g00008-3", "g00097-0", "g00097-1", "g00097-2", "g00097-3"]
OVERFLOW = {"g00097-0": 2, "g00097-3": 2}  # recorded: the request of this turn exceeds the context (a 400)
MAX_RESCHEDULES = 4


PYTHON = target_python("verifiers")  # or ROLLOUT_BENCH_VERIFIERS_PYTHON
needs_verifiers = pytest.mark.skipif(PYTHON is None, reason="the verifiers environment is not built (make targets)")


def _run(variant: str, plan: Plan | None, trace: str, trajectories: list[str], **options: Any) -> RunResult:
    config = RunConfig(trace=trace, plan=plan, target=f"verifiers:{variant}", trajectories=trajectories,
                       watchdog_s=120.0, python=PYTHON, bounds=Bounds(max_requests_per_trajectory=64),
                       target_options={"max_retries": 1, "max_reschedules": MAX_RESCHEDULES, **options})
    return asyncio.run(run(config))


def _by_id(result: RunResult) -> dict[str, SampleRecord]:
    return {r.trajectory: r for r in result.records}


def _server_requests(result: RunResult) -> Counter[str]:
    return Counter(r.trajectory for r in result.requests if r.trajectory is not None)


def _recorded(name: str, ids: list[str]) -> dict[str, Trajectory]:
    with open_trace(shipped_trace(name)) as reader:
        return {t.id: t for t in reader if t.id in ids}


def _held_seed_003() -> Plan:
    """seed-003 with its outage held for the whole run: its 10-second window starts with the server,
    and a worker importing verifiers can take that long to send its first request."""
    shipped = resolve_plan("seed-003")
    outage = make_rule({"fault": "outage"}, "router-outage")
    return Plan(shipped.name + "-held", shipped.seed,
                (outage, *(r for r in shipped.rules if r.name != "router-outage")))


@pytest.fixture(scope="module")
def outage_vs_empty() -> RunResult:
    """verifiers alone: g00000 behind a dead router (text/plain 503), g00001-1 answered empty once."""
    plan = plan_from_specs(["outage:router_version=0.2,groups=g00000",
                            "empty_completion:attempts=1,trajectories=g00001-1"], seed=3)
    return _run("plain", plan, "rlvr-500", RLVR)


@pytest.fixture(scope="module")
def churn() -> RunResult:
    return _run("unfixed", _held_seed_003(), "rlvr-500", SEED_003)


@pytest.fixture(scope="module")
def fail_fast() -> RunResult:
    return _run("fixed", _held_seed_003(), "rlvr-500", SEED_003)


@pytest.fixture(scope="module")
def tool_retry() -> RunResult:
    """The tool environment over agentic traces; g00008-1's third turn comes back empty once."""
    return _run("fixed", plan_from_specs(["empty_completion:attempts=1,trajectories=g00008-1,turns=2"], seed=3),
                "agentic-500", AGENTIC)


def test_variants_and_declared_policy() -> None:
    """The adapter loads without verifiers (it imports it in `run`), so the harness can name it."""
    assert [(t.name, t.fail_fast) for t in map(resolve_target, ("verifiers", "verifiers:fixed", "verifiers:plain"))] \
        == [("verifiers:unfixed", False), ("verifiers:fixed", True), ("verifiers:plain", False)]
    with pytest.raises(TargetError, match="unfixed, fixed, plain"):
        resolve_target("verifiers:other")


def test_multi_turn_steps_join_into_one_sample() -> None:
    """Step k's prompt extends step k-1's prompt and completion; the tail is environment tokens (mask 0)."""
    steps = [{"tokens": {"prompt_ids": [1, 2], "completion_ids": [3, 4], "completion_mask": [1, 1],
                         "completion_logprobs": [-0.1, -0.2]}},
             {"tokens": {"prompt_ids": [1, 2, 3, 4, 5, 6], "completion_ids": [7], "completion_mask": [1],
                         "completion_logprobs": [-0.3]}}]
    joined = assemble(steps)
    assert (joined.prompt_length, joined.ids, joined.mask, joined.logprobs) == (
        2, [3, 4, 5, 6, 7], [1, 1, 0, 0, 1], [-0.1, -0.2, 0.0, 0.0, -0.3])
    steps[1]["tokens"]["prompt_ids"] = [1, 2, 9, 4, 5, 6]  # re-rendered differently: not one sample any more
    assert assemble(steps).prefix_mismatch_step == 1 and assemble(steps).ids == [3, 4]
    assert assemble([{"tokens": None}]).logprobs is None


@needs_verifiers
def test_outage_and_empty_reply_as_verifiers_records_them(outage_vs_empty: RunResult) -> None:
    result = outage_vs_empty
    records, served = _by_id(result), _server_requests(result)
    assert result.batch_error is None and result.worker["versions"]["verifiers"] == "0.1.14"
    for trajectory in RLVR[:4]:  # the dead router: the SDK retried once, then verifiers caught the error
        record = records[trajectory]
        assert (record.outcome, record.status, record.reward, record.response_ids) == ("failed", "has_error", 0.0, [])
        assert record.details["error"] == {"error": "ModelError", "error_chain_repr": SEED_CHAIN,
                                           "error_chain_str": "ModelError -> InternalServerError"}
        assert record.details["requests"] == served[trajectory] == 2
        assert record.details["is_retryable_1427"] is False
    empty = records["g00001-1"]  # a 200 with nothing in it: no SDK retry, a verifiers error of its own
    assert empty.details["error"] == {"error": "EmptyModelResponseError", "error_chain_repr": EMPTY,
                                      "error_chain_str": "EmptyModelResponseError"}
    assert empty.details["requests"] == served["g00001-1"] == 1 and empty.details["is_retryable_1427"] is True
    events = Counter((e.fault, e.trajectory, e.attempt) for e in result.fault_events)
    assert events == Counter({("outage", t, a): 1 for t in RLVR[:4] for a in (1, 2)}
                             | {("empty_completion", "g00001-1", 1): 1})


@needs_verifiers
def test_clean_rollouts_carry_the_recorded_tokens(outage_vs_empty: RunResult) -> None:
    recorded = _recorded("rlvr-500", RLVR)
    for trajectory in ("g00001-0", "g00001-2", "g00001-3"):
        record, turn = _by_id(outage_vs_empty)[trajectory], recorded[trajectory].turns[0].response
        assert record.outcome == "completed" and record.status == "max_turns_reached"
        assert record.response_ids == list(turn.output_ids) and record.logprobs == list(turn.logprobs)
        assert record.loss_mask == [1] * len(turn.output_ids) and record.error is None
        assert record.prompt_length == len(recorded[trajectory].prompt.ids)
        assert record.reward == recorded[trajectory].reward  # the rubric's boxed answer agrees with the trace
    assert {(r.trajectory, r.drift) for r in outage_vs_empty.requests if r.status == 200} == {
        (t, None) for t in RLVR[4:]}  # every request identified by the header verifiers sent, none drifted


@needs_verifiers
def test_schedulers_classify_the_real_dicts(outage_vs_empty: RunResult) -> None:
    """prime-rl before #2579 reschedules both; #2579 needs verifiers#1427's flag, which 0.1.14 lacks."""
    records = _by_id(outage_vs_empty)
    outage, empty = records["g00000-0"].details, records["g00001-1"].details
    assert "is_retryable" not in outage["error"] and "is_retryable" not in empty["error"]
    assert reschedules(outage["error"], fixed=False) and reschedules(empty["error"], fixed=False)  # churn
    assert not reschedules(outage["error"], fixed=True)  # the outage fails fast...
    assert not reschedules(empty["error"], fixed=True)  # ...and so would a retryable reply, without the flag
    flagged = {**empty["error"], "is_retryable": empty["is_retryable_1427"]}
    assert reschedules(flagged, fixed=True)  # with #1427's flag the empty reply is retried again
    assert not reschedules({**outage["error"], "is_retryable": outage["is_retryable_1427"]}, fixed=True)


@needs_verifiers
def test_unfixed_scheduler_churns_through_the_outage(churn: RunResult) -> None:
    records, served = _by_id(churn), _server_requests(churn)
    assert churn.batch_error is None and {r.outcome for r in records.values()} == {"failed"}
    attempts = {r.group: r.details["group_attempt"] for r in records.values()}
    assert sum(attempts.values()) == 2 + MAX_RESCHEDULES  # replacement groups until the bench's cap
    for trajectory, record in records.items():
        assert record.details["requests"] == served[trajectory] == 2 * attempts[record.group]
        assert record.details["error"]["error_chain_str"] == "ModelError -> InternalServerError"
        assert NO_WORKERS in record.details["error"]["error_chain_repr"]
    statuses = Counter((r.trajectory, r.attempt, r.status) for r in churn.requests if r.attempt == 1)
    assert {t for (t, _, status) in statuses if status == 429} == RATE_LIMITED  # the SDK retried each 429
    storms = {v.trajectory for v in churn.violations if v.invariant == "retry_discipline"}
    assert storms == {t for t, r in records.items() if attempts[r.group] > 1}  # at least one group churned
    assert storms


@needs_verifiers
def test_fixed_scheduler_fails_fast_on_the_outage(fail_fast: RunResult) -> None:
    records, served = _by_id(fail_fast), _server_requests(fail_fast)
    assert fail_fast.batch_error.type == "RuntimeError"
    assert "non-retryable rollout error" in fail_fast.batch_error.message
    assert NO_WORKERS in fail_fast.batch_error.message
    outcomes = Counter(r.outcome for r in records.values())
    assert outcomes == {"failed": 4, "lost": 4}  # the first group to fail stops the batch; the other is cancelled
    assert all(served[t] <= 2 for t in SEED_003)  # one group attempt: the request and the SDK's one retry
    assert max(r.attempt for r in fail_fast.requests if r.trajectory) == 2
    assert [v for v in fail_fast.violations if v.invariant == "retry_discipline"] == []


@needs_verifiers
def test_fixed_scheduler_retries_an_empty_tool_turn(tool_retry: RunResult) -> None:
    """Tool environment: the empty reply (turn 2) is retryable, the group runs again and completes."""
    records, served = _by_id(tool_retry), _server_requests(tool_retry)
    recorded = _recorded("agentic-500", AGENTIC)
    assert tool_retry.batch_error is None
    assert [(e.fault, e.trajectory, e.turn, e.attempt) for e in tool_retry.fault_events] == [
        ("empty_completion", "g00008-1", 2, 1)]
    for trajectory in AGENTIC:
        record, trajectory_record = records[trajectory], recorded[trajectory]
        group_attempts = 2 if trajectory.startswith("g00008") else 1
        assert record.details["group_attempt"] == group_attempts
        assert record.details["requests"] == served[trajectory]
        if trajectory in OVERFLOW:  # the request past the context: vLLM's 400, verifiers' prompt_too_long
            assert (record.outcome, record.status, record.details["steps"]) == ("truncated", "prompt_too_long",
                                                                                OVERFLOW[trajectory])
            refused = [r for r in tool_retry.requests if r.trajectory == trajectory and r.status == 400]
            assert [r.turn for r in refused] == [OVERFLOW[trajectory]]
            continue
        turns = trajectory_record.turns
        assert record.outcome == "completed" and record.details["steps"] == len(turns)
        last = len(turns) - 1
        full = list(trajectory_record.request_input_ids(last)) + list(turns[last].response.output_ids)
        assert record.prompt_length + record.response_length == len(full)
        assert full[record.prompt_length:] == record.response_ids  # tool outputs replayed byte for byte
        assert sum(record.loss_mask) == sum(len(t.response.output_ids) for t in turns)
        assert record.reward == trajectory_record.reward
    drift = [(r.trajectory, r.turn, r.drift) for r in tool_retry.requests if r.drift is not None]
    assert drift == []
