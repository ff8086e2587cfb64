"""Real AReaL (PyPI `areal`): its remote SGLang engine with the RLVR workflow (rlvr-500) and a tool agent on
ArealOpenAI (agentic-500), against the bench server."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from bench import RunConfig, RunResult, run_blocking
from bench.targets.frameworks.envs import target_python
from bench.tokenizer import load_tokenizer
from faults import Plan, plan_from_specs, resolve_plan
from faults.hooks import POISON_MARKER

AREAL_PYTHON = target_python("areal")
pytestmark = pytest.mark.skipif(AREAL_PYTHON is None, reason="the areal environment is not built (make targets)")


def _run(plan, n: int = 16):  # type: ignore[no-untyped-def]
    return run_blocking(RunConfig(trace="rlvr-500", target="areal", n=n, plan=plan, python=AREAL_PYTHON))


def test_areal_trains_on_exactly_what_it_was_served_and_the_report_names_its_version() -> None:
    result = _run(plan_from_specs(["latency:ms=1,p=1"], seed=0))
    assert result.violations == [], [v.message for v in result.violations]
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == 16
    assert set(result.provenance.values()) == {"match (tokens+logprobs)"}
    assert result.framework == {"framework": "areal", "version": "1.0.4", "max_weight_lag": "0"}
    assert all(r.response_ids and len(r.logprobs or []) == r.response_length for r in result.records)


def test_areal_drops_an_episode_without_logprobs_naming_the_keyerror() -> None:
    result = _run(plan_from_specs(["missing_logprobs:p=1,trajectories=g00000-1"], seed=0))
    (failed,) = [r for r in result.records if r.outcome == "failed"]
    assert failed.trajectory == "g00000-1" and failed.error is not None
    assert failed.error.type == "KeyError" and "output_token_logprobs" in failed.error.message
    assert "sglang_remote.py" in failed.error.traceback  # the line in AReaL that read the answer
    assert [v.invariant for v in result.violations] == []


def test_areal_retries_the_routers_terminal_no_workers_answer_twice_then_drops_the_episode() -> None:
    """Seed 003's outage on AReaL: its engine retries every error, the router's "No available workers" 503
    too, three attempts 1 s apart (`arequest_with_retry`, `request_retries` 3), then drops the episode: two
    requests after the terminal answer, within the bench's bound. (Identified by arrival order, before the
    adapter named trajectories, the four members' retries were all put on one member: "9 requests".)"""
    result = _run(resolve_plan("seed-003"), n=8)
    assert all(r.outcome == "failed" and r.error is not None and "Failed after 3 retries" in r.error.message
               for r in result.records) and len(result.records) == 8
    sent = Counter(q.trajectory for q in result.requests if q.endpoint == "/generate")
    assert set(sent.values()) == {3} and len(sent) == 8
    assert all(q.status == 503 and not q.by_order for q in result.requests if q.endpoint == "/generate")
    assert [v for v in result.violations if v.invariant == "retry_discipline"] == []


def test_areal_retries_seed_002s_server_errors_and_resets_and_keeps_every_episode() -> None:
    """Seed 002 on AReaL: its engine retries the 500s and the dropped connection, so every episode trains."""
    result = _run(resolve_plan("seed-002"), n=200)
    hit = {e.trajectory for e in result.fault_events}
    assert {e.fault for e in result.fault_events} == {"http_error", "connection_reset"} and len(hit) >= 3
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == 200
    requests = {t: sum(q.trajectory == t for q in result.requests) for t in hit}
    assert all(count >= 2 for count in requests.values()), requests  # retried, not lucky
    assert result.violations == [], [v.message for v in result.violations]


# --- AReaL's agentic path (`workflow=agent`: a tool agent on ArealOpenAI, concat export) on agentic-500 ---
# Fault decisions are a pure function of (plan seed, rule, trajectory, turn, attempt) and every request names
# its trajectory, so a group does here what it does in the 500-trajectory run. Under seed-004, group g00000:
# g00000-1 loses its logprobs at turn 1, g00000-2's turn 2 becomes a 60000-byte tool call, g00000-3 is
# aborted at turn 14 (after 10 tokens). g00001-3 reaches turn 20 with 6233 input tokens: 1959 left.
GROUP = [f"g00000-{m}" for m in range(4)]
NEAR_FULL = "g00001-3"


def _agent(plan: Plan, trajectories: list[str], **options: Any) -> RunResult:
    result = run_blocking(RunConfig(trace="agentic-500", target="areal", plan=plan, trajectories=trajectories,
                                    python=AREAL_PYTHON, target_options=options))
    print(f"areal agent {options}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}")
    return result


@pytest.fixture(scope="module")
def capped() -> RunResult:
    """No fault; the client capped at the context (`engine_max_tokens`, as AReaL's tau2 config sets it)."""
    return _agent(plan_from_specs(["latency:ms=1,p=1"], seed=0), GROUP + [NEAR_FULL], engine_max_tokens=8192)


@pytest.fixture(scope="module")
def seed_004() -> RunResult:
    return _agent(resolve_plan("seed-004"), GROUP, engine_max_tokens=8192)


def test_areal_agent_trains_on_whole_conversations_with_tool_outputs_under_mask_0(capped: RunResult) -> None:
    assert capped.violations == [], [v.message for v in capped.violations]
    assert {r.outcome for r in capped.records} == {"completed"} and len(capped.records) == 5
    assert set(capped.provenance.values()) == {"match (tokens+logprobs)"}
    assert all(r.drift is None and r.status == 200 for r in capped.requests if r.endpoint == "/generate")
    for record in capped.records:
        served = [q for q in capped.requests if q.trajectory == record.trajectory and q.endpoint == "/generate"]
        assert record.details is not None and record.details["turns"] == len(served) > 1
        assert record.details["leaves"] == 1 and record.details["rows"] == 1  # one linear conversation
        trained = sum(record.loss_mask)
        assert trained == sum(q.completion_tokens or 0 for q in served)  # every turn's output, and only those
        assert 0 < record.response_length - trained  # the tool outputs (and chat markup) are there, under 0
        assert len(record.logprobs or []) == len(record.loss_mask) == len(record.response_ids)
        assert all(lp == 0.0 for lp, m in zip(record.logprobs or [], record.loss_mask) if not m)


def test_areal_agent_without_a_context_cap_asks_past_the_context_and_drops_the_episode() -> None:
    """AReaL's defaults (no `engine_max_tokens`; `max_tokens` 32768) never clamp a turn to the server's
    context: turn 20 of g00001-3 asks for 6233 + 2048 tokens of 8192, is refused, retried, and the
    episode is dropped. With the cap (the `capped` run) the same trajectory completes."""
    result = _agent(plan_from_specs(["latency:ms=1,p=1"], seed=0), [NEAR_FULL])
    (record,) = result.records
    assert record.outcome == "failed" and record.error is not None
    assert "Failed after 3 retries" in record.error.message
    (violation,) = [v for v in result.violations if v.invariant == "context_budget"]
    assert violation.trajectory == NEAR_FULL and "turn 20" in violation.message
    assert "6233 input + 2048 new tokens" in violation.message
    refused = [q for q in result.requests if q.trajectory == NEAR_FULL and q.status == 400]
    assert len(refused) == 3 and {q.turn for q in refused} == {20}  # AReaL's three attempts


def test_areal_agent_under_seed_004_drops_what_it_cannot_train_on_and_resumes_the_abort(seed_004: RunResult) -> None:
    by_id = {r.trajectory: r for r in seed_004.records}
    fired = {(e.rule, e.trajectory, e.turn) for e in seed_004.fault_events}
    assert fired == {("text-without-logprobs", "g00000-1", 1), ("huge-tool-output", "g00000-2", 2),
                     ("aborted-then-retried", "g00000-3", 14)}
    # an answer without logprobs: AReaL's engine reads meta_info["output_token_logprobs"] and the episode fails
    lost_logprobs = by_id["g00000-1"]
    assert lost_logprobs.outcome == "failed" and lost_logprobs.error is not None
    assert lost_logprobs.error.type == "KeyError" and "sglang_remote.py" in lost_logprobs.error.traceback
    # the 60000-byte tool output: AReaL runs the tool, then its engine refuses the prompt before sending it
    huge = by_id["g00000-2"]
    assert huge.outcome == "failed" and huge.error is not None and huge.error.type == "ValueError"
    assert "exceeds max_total_tokens 8192" in huge.error.message
    assert max(q.turn or 0 for q in seed_004.requests if q.trajectory == "g00000-2") == 2  # never sent
    # the abort: AReaL's agenerate resumes it and the episode trains on exactly the tokens served
    aborted = by_id["g00000-3"]
    assert aborted.outcome == "completed" and seed_004.provenance["g00000-3"] == "match (tokens+logprobs)"
    assert by_id["g00000-0"].outcome == "completed"
    assert seed_004.violations == [], [v.message for v in seed_004.violations]


def test_areal_agent_trains_on_text_after_a_tool_call_that_its_reward_never_sees() -> None:
    """Seed 000 on the agent path: the poison follows g00120-3's first tool call. AReaL's tool-call parser
    (sglang's Qwen25Detector, AReaL's default `qwen`) keeps only the text before the first `<tool_call>` as
    `message.content`, so the agent and its reward never read it and nothing raises; the sample trains on
    the reply's tokens, the poison's included (loss mask 1)."""
    result = _agent(resolve_plan("seed-000"), ["g00120-3"], engine_max_tokens=8192)
    (event,) = result.fault_events
    assert (event.trajectory, event.turn, event.reach) == ("g00120-3", 0, "not consumed")
    (record,) = result.records
    assert record.outcome == "completed" and record.error is None
    assert result.provenance["g00120-3"] == "match (tokens+logprobs)"
    trained = [token for token, mask in zip(record.response_ids, record.loss_mask) if mask]
    assert POISON_MARKER in load_tokenizer().decode(trained)


def test_areal_agent_trains_on_a_nan_logprob_and_token_alignment_names_it() -> None:
    """A NaN logprob in the answer is kept as AReaL read it (`torch.tensor` takes NaN; a null it refuses, see
    chaos) and trained on under loss mask 1: one NaN makes the batch's loss NaN. Provenance accepts it (NaN
    served is "none shown", and NaN held matches it); token_alignment names the trained NaN and the fault."""
    result = _agent(plan_from_specs(["nan_logprob:p=1,trajectories=g00000-0,turns=1"], seed=0), ["g00000-0"],
                    engine_max_tokens=8192)
    (record,) = result.records
    assert [(e.fault, e.turn) for e in result.fault_events] == [("nan_logprob", 1)]
    assert record.outcome == "completed"
    assert sum(1 for lp, m in zip(record.logprobs or [], record.loss_mask) if m and math.isnan(lp)) == 1
    (violation,) = result.violations
    assert violation.invariant == "token_alignment" and "non-finite logprob" in violation.message
    assert violation.evidence["count"] == 1 and violation.fault is not None and violation.fault["fault"] == "nan_logprob"
