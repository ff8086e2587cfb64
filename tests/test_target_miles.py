"""The `miles` target: real miles 0.0.2 (PyPI `miles-rl`) in its own environment, run by the worker
against the bench server; seed 000 (a reply that makes post-processing raise) on its legacy
`generate_rollout`, train and eval, unfixed and patched; seed 004 on its multi-turn tool generator.

Skipped only when the miles environment is absent (`make targets` builds it;
`ROLLOUT_BENCH_MILES_PYTHON` names another interpreter). Runs use a few groups of agentic-500 by
id: fault decisions are a pure function of (plan seed, rule, trajectory, turn, attempt), so a
trajectory does here what it does in the 500-trajectory run. Under seed-000 the poisoned reply is
g00120-3's first turn; each scenario is one worker run, shared by the tests that read it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, RunResult, SampleRecord, run
from bench.invariants import Bounds
from bench.orchestration.repro import load_repro, write_repro
from bench.targets.frameworks.envs import target_python
from faults import Plan, resolve_plan
from faults.hooks import POISON_MARKER

CONTEXT = 8192  # agentic-500's context length
POISONED = "g00120-3"
SEED_000 = [f"g0012{g}-{m}" for g in (0, 1) for m in range(4)]  # the poisoned group and the next one
# Multi-turn: a reply that left the recording (poisoned, without ids) makes the replay answer later turns
# as drifted requests of its last recorded turn; retry_discipline tells them from retries by their length,
# so the default bounds hold.
BOUNDS = Bounds()
# Under seed-004: g00000-1 loses its logprobs at turn 1, g00000-2's turn 2 becomes a 60000-byte tool call,
# g00000-3 is aborted (not resubmitted), g00023-1's recorded tool output at turn 3 takes it to 8137 input
# tokens, g00027-1 is aborted at turn 3 and resubmitted (stale-retry fires) with its group.
SEED_004 = ["g00000-0", "g00000-1", "g00000-2", "g00000-3", "g00023-1",
            "g00027-0", "g00027-1", "g00027-2", "g00027-3"]


PYTHON = target_python("miles")  # or ROLLOUT_BENCH_MILES_PYTHON
needs_miles = pytest.mark.skipif(PYTHON is None, reason="the miles environment is not built (make targets)")


def _config(target: str, plan: Plan | None, trajectories: list[str], **options: Any) -> RunConfig:
    return RunConfig(trace="agentic-500", plan=plan, target=target, trajectories=trajectories, python=PYTHON,
                     watchdog_s=120.0, time_scale=0.05, bounds=BOUNDS, target_options=options)


def _run(config: RunConfig) -> RunResult:
    result = asyncio.run(run(config))
    print(f"{config.target} {config.target_options}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, plan seed {config.plan and config.plan.seed}")
    return result


def _by_id(result: RunResult) -> dict[str, SampleRecord]:
    return {r.trajectory: r for r in result.records}


@pytest.fixture(scope="module")
def unfixed() -> RunResult:
    return _run(_config("miles", resolve_plan("seed-000"), SEED_000))


@pytest.fixture(scope="module")
def patched() -> RunResult:
    return _run(_config("miles:patched", resolve_plan("seed-000"), SEED_000))


@needs_miles
def test_seed000_train_loses_the_whole_rollout_with_its_root_cause(unfixed: RunResult) -> None:
    """Legacy train path: the group raises, `generate_rollout` re-raises, every trajectory of the step is lost."""
    assert [(e.rule, e.trajectory, e.turn) for e in unfixed.fault_events] == [("poison-after-generate", POISONED, 0)]
    assert unfixed.batch_error is not None
    assert unfixed.batch_error.type == "InjectedFault" and POISON_MARKER in unfixed.batch_error.message
    assert "generate_and_rm_group" in unfixed.batch_error.traceback  # raised through miles' own group gather
    assert {r.outcome for r in unfixed.records} == {"lost"}
    survival = [v for v in unfixed.violations if v.invariant == "batch_survival"]
    assert len(survival) == 1 and survival[0].trajectory == POISONED
    assert survival[0].evidence["lost"] == len(SEED_000) and survival[0].evidence["error_type"] == "InjectedFault"
    assert survival[0].fault is not None and survival[0].fault["fault"] == "raise_after_generate"


@needs_miles
def test_seed000_siblings_were_served_and_thrown_away(unfixed: RunResult) -> None:
    """The other trajectories' requests reached the server (work done, results discarded with the crash)."""
    answered = Counter(q.trajectory for q in unfixed.requests if q.endpoint == "/generate" and q.status == 200)
    siblings = [t for t in SEED_000 if t != POISONED]
    assert all(answered[t] >= 1 for t in siblings), answered
    crash = unfixed.target_returned_at
    assert crash is not None
    in_flight = [q for q in unfixed.requests
                 if q.trajectory in siblings and q.started <= crash
                 and (q.latency_s is None or q.started + q.latency_s > crash)]
    print(f"sibling requests answered: {sum(answered[t] for t in siblings)}; in flight when the rollout raised: "
          f"{len(in_flight)}")


@needs_miles
def test_seed000_patched_keeps_one_aborted_placeholder(patched: RunResult) -> None:
    records = _by_id(patched)
    assert patched.batch_error is None and patched.hang is None
    assert [(e.trajectory, e.turn) for e in patched.fault_events] == [(POISONED, 0)]
    aborted = [r for r in patched.records if r.outcome == "aborted"]
    assert [r.trajectory for r in aborted] == [POISONED]
    stand_in = records[POISONED]
    assert stand_in.status == "ABORTED" and stand_in.response_length == 1 and stand_in.loss_mask == [0]
    assert stand_in.reward == 0.0 and stand_in.error is not None and stand_in.error.type == "InjectedFault"
    assert stand_in.details is not None and stand_in.details["remove_sample"] is True
    assert all(records[t].outcome in ("completed", "truncated") for t in SEED_000 if t != POISONED)
    assert not {"batch_survival", "abort_contract", "group_completeness", "accounting"} & \
        {v.invariant for v in patched.violations}


@needs_miles
def test_seed000_eval_crashes_whichever_variant() -> None:
    """Eval gathers `generate_and_rm` per sample with no group in between: the patch does not reach it."""
    result = _run(_config("miles:patched", resolve_plan("seed-000"), SEED_000[:4], mode="eval"))
    assert result.batch_error is not None and result.batch_error.type == "InjectedFault"
    assert "eval_rollout" in result.batch_error.traceback
    assert {r.outcome for r in result.records} == {"lost"}
    assert "batch_survival" in {v.invariant for v in result.violations}


@needs_miles
def test_seed000_repro_crashes_again_on_one_trajectory(unfixed: RunResult, tmp_path: Path) -> None:
    path = write_repro(unfixed, tmp_path / "repro.toml")
    assert path is not None
    repro = load_repro(path, python=PYTHON, watchdog_s=120.0)
    assert repro.config.trajectories == [POISONED] and repro.invariant == "batch_survival"
    again = _run(repro.config)
    assert [(e.trajectory, e.turn, e.attempt) for e in again.fault_events] == [(POISONED, 0, 1)]
    assert again.batch_error is not None and again.batch_error.type == "InjectedFault"
    assert [v.invariant for v in again.violations if v.invariant == "batch_survival"] == ["batch_survival"]


OVERFLOW_GROUP = [f"g00023-{m}" for m in range(4)]  # g00023-1 and -3 (and g00120-1): recorded context overflows


def _known_config(target: str, trajectories: list[str] | None, known: str | None) -> RunConfig:
    config = _config(target, resolve_plan("seed-000"), trajectories or [])
    config.trajectories, config.known = trajectories, known
    return config


@needs_miles
def test_seed000_patched_passes_with_miles_known_context_overflow() -> None:
    """The patch fixes seed-000; what is left is miles' own context overflow, declared in `--known miles`."""
    plain = _run(_known_config("miles:patched", SEED_000 + OVERFLOW_GROUP, None))
    overflowed = {t for t, outcome in plain.recorded_outcomes.items() if outcome == "context_overflow"}
    assert overflowed == {"g00120-1", "g00023-1", "g00023-3"}
    assert {(v.invariant, v.trajectory) for v in plain.violations} == {("context_budget", t) for t in overflowed}
    known = _run(_known_config("miles:patched", SEED_000 + OVERFLOW_GROUP, "miles"))
    assert known.ok and known.violations == []
    assert {k.violation.trajectory for k in known.known_violations} == overflowed
    assert [r.trajectory for r in known.records if r.outcome == "aborted"] == [POISONED]
    unfixed = _run(_known_config("miles", SEED_000 + OVERFLOW_GROUP, "miles"))
    assert not unfixed.ok and {v.invariant for v in unfixed.violations} >= {"batch_survival"}


@needs_miles
def test_seed000_full_patched_run_passes_with_known_findings() -> None:
    """The issue's bar as a user runs it: all 500 agentic trajectories, `miles:patched --known miles`."""
    config = _known_config("miles:patched", None, "miles")
    config.time_scale = 0.0
    result = _run(config)
    outcomes = Counter(r.outcome for r in result.records)
    print(f"full run: {dict(outcomes)}; known {len(result.known_violations)}; "
          f"{len(result.requests)} requests in {result.duration_s:.1f} s")
    assert len(result.records) == 500 and outcomes["aborted"] == 1 and outcomes["lost"] == 0
    assert outcomes["completed"] + outcomes["truncated"] == 499
    assert result.ok, [(v.invariant, v.trajectory, v.message) for v in result.violations]
    assert result.known_violations and {k.violation.invariant for k in result.known_violations} == {"context_budget"}
    assert {result.recorded_outcomes[k.violation.trajectory] for k in result.known_violations} == {"context_overflow"}


@pytest.fixture(scope="module")
def seed004() -> RunResult:
    return _run(_config("miles", resolve_plan("seed-004"), SEED_004))


def _violations(result: RunResult, trajectory: str) -> set[str]:
    return {v.invariant for v in result.violations if v.trajectory == trajectory}


def _events(result: RunResult, trajectory: str) -> set[str]:
    return {e.fault for e in result.fault_events if e.trajectory == trajectory}


@needs_miles
def test_seed004_stale_retry_breaks_token_alignment(seed004: RunResult) -> None:
    """A resubmitted aborted sample keeps its old response fields; miles' multi-turn restarts `tokens` from the
    prompt and appends onto the rest: response ids fall short of response_length, loss mask and logprobs."""
    record = _by_id(seed004)["g00027-1"]
    assert "abort" in _events(seed004, "g00027-1") and record.details["generate_calls"] >= 2
    assert len(record.response_ids) < record.response_length == len(record.loss_mask) == len(record.logprobs)
    assert record.details["validate"] == "ok"  # miles' own length check does not see it
    assert "token_alignment" in _violations(seed004, "g00027-1")


@needs_miles
def test_seed004_oversized_tool_output_breaks_the_context_budget(seed004: RunResult) -> None:
    record = _by_id(seed004)["g00000-2"]
    assert _events(seed004, "g00000-2") == {"oversized_tool_output"}
    assert record.outcome == "truncated" and record.prompt_length + record.response_length > 60000 > CONTEXT
    assert "context_budget" in _violations(seed004, "g00000-2")


@needs_miles
def test_seed004_context_overflow_clamped_per_turn_but_recorded_tool_output_overflows(seed004: RunResult) -> None:
    """`rollout_max_context_len` clamps every turn's max_new_tokens: no request is refused for the context. The
    recorded tool output that brings g00023-1 near the limit is still appended untrimmed."""
    assert all(q.status == 200 for q in seed004.requests)
    assert not [v for v in seed004.violations if v.invariant == "context_budget" and "asked for" in v.message]
    record = _by_id(seed004)["g00023-1"]
    assert _events(seed004, "g00023-1") == set() and record.outcome == "truncated"
    assert record.prompt_length + record.response_length > CONTEXT
    assert _violations(seed004, "g00023-1") == {"context_budget"}


@needs_miles
def test_seed004_missing_logprobs_pass_silently(seed004: RunResult) -> None:
    """A reply without `output_token_logprobs`: miles keeps its text, appends no ids and no logprobs; lengths agree
    (token_alignment holds), so nothing flags the turn the trainer never sees; its text outnumbers the ids."""
    record = _by_id(seed004)["g00000-1"]
    assert "missing_logprobs" in _events(seed004, "g00000-1")
    assert len(record.response_ids) == record.response_length == len(record.loss_mask) == len(record.logprobs)
    assert record.details["response_text_tokens"] > record.response_length
    assert "token_alignment" not in _violations(seed004, "g00000-1")
    clean = _by_id(seed004)["g00000-0"]  # no fault: the text is the ids minus each turn's stop token
    assert clean.details["response_text_tokens"] < clean.response_length


@needs_miles
def test_seed004_aborted_sample_is_trained_on(seed004: RunResult) -> None:
    """An ABORTED sample that is not resubmitted stays in miles' batch with its loss mask (abort contract broken)."""
    record = _by_id(seed004)["g00000-3"]
    assert _events(seed004, "g00000-3") == {"abort"} and record.outcome == "aborted"
    assert sum(record.loss_mask) > 0 and record.details["remove_sample"] is False
    assert "abort_contract" in _violations(seed004, "g00000-3")


@needs_miles
def test_seed004_fault_free_trajectory_replays_exactly(seed004: RunResult) -> None:
    """miles' multi-turn requests match the recording turn by turn (tools replayed, tool turns tokenized with
    the adapter's chat template) wherever no fault intervened."""
    requests = [q for q in seed004.requests if q.trajectory == "g00000-0"]
    assert _events(seed004, "g00000-0") == set() and len(requests) >= 2
    assert [q.turn for q in requests] == list(range(len(requests)))
    assert all(q.drift is None and q.attempt == 1 for q in requests)
