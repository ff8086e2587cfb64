"""Seed 004 (slime#1861) on ref-tool-loop: the four multi-turn desyncs, unfixed caught, fixed clean.

Runs use a few trajectories of agentic-500 by id: fault decisions are a pure function of
(plan seed, rule, trajectory, turn, attempt), so a trajectory does in a subset exactly what it
does in the full 500-trajectory run, and the subsets stay fast.
"""

from __future__ import annotations

import asyncio

import pytest

from bench import RunConfig, RunResult, SampleRecord, run
from bench.invariants import Bounds, RunView, context_budget
from bench.records.request_log import RequestRecord
from bench.targets import TargetError, resolve_target
from bench.targets.recorded_tools import RecordedTools
from bench.targets.reference.tool_loop import parse_tool_calls, tool_message
from bench.tokenizer import load_tokenizer
from faults import Plan, plan_from_specs, resolve_plan
from faults.hooks import emit_code, emit_command

CONTEXT = 8192  # agentic-500's context length
# Multi-turn: up to 50 recorded turns each, replayed again when an aborted sample is resubmitted.
BOUNDS = Bounds(max_requests_per_trajectory=100)
# Under seed-004: g00000-1 loses its logprobs at turn 1, g00000-2's turn 2 becomes a 60000-byte tool
# call, g00000-3 and g00027-2/-3 are aborted (not resubmitted), g00027-1 is aborted at turn 3 and
# resubmitted (stale-retry fires), g00023-1 reaches 8137 input tokens at turn 4 (recorded tool output).
SEED_004 = ["g00000-0", "g00000-1", "g00000-2", "g00000-3", "g00023-1",
            "g00027-0", "g00027-1", "g00027-2", "g00027-3"]
ONE = "g00000-0"  # 5 turns, a tool call in each of the first four
STALE = [f"abort:keep=0.5,first=1,trajectories={ONE},turns=2", f"stale_retry:trajectories={ONE}"]
NO_LOGPROBS = [f"missing_logprobs:trajectories={ONE},turns=1"]
HUGE_OUTPUT = [f"oversized_tool_output:bytes=60000,trajectories={ONE},turns=1"]


def _run(variant: str, plan: Plan | None, trajectories: list[str]) -> RunResult:
    return asyncio.run(run(RunConfig(trace="agentic-500", plan=plan, target=f"ref-tool-loop:{variant}",
                                     trajectories=trajectories, bounds=BOUNDS)))


def _by_id(result: RunResult) -> dict[str, SampleRecord]:
    return {r.trajectory: r for r in result.records}


def _lengths(record: SampleRecord) -> dict[str, int | None]:
    return {"response_ids": len(record.response_ids),
            "logprobs": None if record.logprobs is None else len(record.logprobs),
            "loss_mask": len(record.loss_mask), "response_length": record.response_length}


def _assert_clean(result: RunResult) -> None:
    """Aligned, within the context, and ABORTED samples masked out."""
    assert result.violations == [] and result.batch_error is None and result.hang is None
    for record in result.records:
        lengths = _lengths(record)
        assert len({v for v in lengths.values() if v is not None}) == 1, (record.trajectory, lengths)
        assert record.prompt_length + record.response_length <= CONTEXT
        if record.outcome == "aborted":
            assert not any(record.loss_mask) and record.reward == 0.0


# -- seed-004 as shipped ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unfixed() -> RunResult:
    return _run("unfixed", resolve_plan("seed-004"), SEED_004)


@pytest.fixture(scope="module")
def fixed() -> RunResult:
    return _run("fixed", resolve_plan("seed-004"), SEED_004)


def test_seed_004_fires_every_fault_on_these_trajectories(unfixed: RunResult, fixed: RunResult) -> None:
    for result in (unfixed, fixed):
        fired = {(e.rule, e.trajectory, e.turn, e.attempt) for e in result.fault_events}
        assert ("text-without-logprobs", "g00000-1", 1, 1) in fired
        assert ("huge-tool-output", "g00000-2", 2, 1) in fired
        assert ("aborted-then-retried", "g00027-1", 3, 1) in fired
        # stale-retry is client-side (not in the server's fault log): the resubmission shows as attempt 2
        resubmitted = sorted(r.turn for r in result.requests if r.trajectory == "g00027-1" and r.attempt == 2)
        assert resubmitted == [0, 1, 2, 3]
        assert not any(r.attempt and r.attempt > 1 for r in result.requests if r.trajectory == "g00000-3")


def test_seed_004_unfixed_breaks_alignment_and_the_context(unfixed: RunResult) -> None:
    found = {(v.invariant, v.trajectory): v for v in unfixed.violations}
    assert set(found) == {("token_alignment", "g00000-1"), ("token_alignment", "g00027-1"),
                          ("context_budget", "g00000-2"), ("context_budget", "g00023-1"),
                          ("provenance", "g00000-1"), ("provenance", "g00027-1")}
    records = _by_id(unfixed)

    # provenance names where the trained tokens came from: attempt 1's turn 0 kept in front of attempt 2's turns
    kept = found[("provenance", "g00027-1")].evidence
    assert kept["kind"] == "earlier attempt" and kept["composition"][0]["attempt"] == 1
    assert not kept["composition"][0]["final_attempt"] and kept["composition"][0]["turn"] == 0
    # and the retokenized reply lost the end-of-turn token the server sent
    lost = found[("provenance", "g00000-1")].evidence
    assert lost["kind"] == "missing" and lost["served_by"]["turn"] == 1 and lost["got"] != lost["expected"]

    stale = found[("token_alignment", "g00027-1")]  # (1) the resubmitted sample kept attempt 1's turns 0-2
    assert stale.evidence["response_ids"] == stale.evidence["logprobs"] > stale.evidence["response_length"]
    assert stale.fault is not None and (stale.fault["trajectory"], stale.fault["turn"]) == ("g00027-1", 3)
    assert records["g00027-1"].outcome == "completed"

    missing = found[("token_alignment", "g00000-1")]  # (3) retokenized text: ids without logprobs
    assert missing.evidence["logprobs"] < missing.evidence["response_ids"] == missing.evidence["loss_mask"]
    assert missing.fault is not None and missing.fault["fault"] == "missing_logprobs"

    huge = found[("context_budget", "g00000-2")]  # (4) the tool output went in whole
    assert huge.evidence["prompt_length"] + huge.evidence["response_length"] > 60000 > CONTEXT
    assert huge.evidence["context_length"] == CONTEXT
    assert huge.fault is not None and huge.fault["fault"] == "oversized_tool_output"
    assert records["g00000-2"].outcome == "truncated"

    clamp = found[("context_budget", "g00023-1")]  # (2) the turn asked for 2048 with 55 left
    assert (clamp.evidence["turn"], clamp.evidence["input_tokens"], clamp.evidence["max_new_tokens"]) == (4, 8137, 2048)
    assert clamp.evidence["requested_total"] > CONTEXT and clamp.evidence["status"] == 400
    assert records["g00023-1"].outcome == "failed"


def test_seed_004_fixed_is_aligned_aborted_or_truncated(fixed: RunResult) -> None:
    _assert_clean(fixed)
    outcomes = {r.trajectory: r.outcome for r in fixed.records}
    assert outcomes == {"g00000-0": "completed", "g00000-1": "aborted", "g00000-2": "truncated",
                        "g00000-3": "aborted", "g00023-1": "truncated", "g00027-0": "completed",
                        "g00027-1": "completed", "g00027-2": "aborted", "g00027-3": "aborted"}
    records = _by_id(fixed)
    assert records["g00000-2"].prompt_length + records["g00000-2"].response_length == CONTEXT  # trimmed to fit
    assert records["g00000-1"].error is not None and "output_token_logprobs" in records["g00000-1"].error.message
    assert all(r.drift is None for r in fixed.requests)  # the recorded tool outputs keep the replay exact


# -- one desync at a time, forced on one trajectory --------------------------------------------------

def test_stale_state_on_retry() -> None:
    plan = plan_from_specs(STALE, seed=4)
    broken = _run("unfixed", plan, [ONE])
    assert [(v.invariant, v.trajectory) for v in broken.violations] == [("token_alignment", ONE), ("provenance", ONE)]
    evidence, fault = broken.violations[0].evidence, broken.violations[0].fault
    kept = broken.violations[1].evidence  # attempt 1's turns 0-1 (its aborted turn 2 was not kept), then attempt 2's
    assert kept["kind"] == "earlier attempt"
    assert [(c["turn"], c["attempt"], c["final_attempt"]) for c in kept["composition"][:3]] == [
        (0, 1, False), (1, 1, False), (0, 2, True)]
    record = broken.records[0]
    assert evidence == _lengths(record) and record.outcome == "completed"
    assert evidence["logprobs"] == evidence["loss_mask"] == evidence["response_ids"] > evidence["response_length"]
    assert fault is not None and (fault["fault"], fault["turn"], fault["attempt"]) == ("abort", 2, 1)

    kept_ids = _run("unfixed", plan_from_specs([STALE[0], STALE[1] + ",keep_tokens=false"], seed=4), [ONE])
    lengths = kept_ids.violations[0].evidence
    assert lengths["response_ids"] == lengths["response_length"] < lengths["logprobs"] == lengths["loss_mask"]

    repaired = _run("fixed", plan, [ONE])
    _assert_clean(repaired)
    assert repaired.records[0].outcome == "completed" and repaired.records[0].response_length == record.response_length
    assert sum(repaired.records[0].loss_mask) < sum(record.loss_mask)  # unfixed also trains on attempt 1's tokens
    assert sorted(r.turn for r in repaired.requests if r.attempt == 2) == [0, 1, 2]


def test_no_per_turn_clamp() -> None:
    """g00000-2 reaches 6229 input tokens at turn 24 with no fault at all."""
    broken = _run("unfixed", None, ["g00000-2"])
    assert [(v.invariant, v.trajectory) for v in broken.violations] == [("context_budget", "g00000-2")]
    evidence = broken.violations[0].evidence
    assert (evidence["turn"], evidence["input_tokens"], evidence["max_new_tokens"]) == (24, 6229, 2048)
    assert evidence["requested_total"] == 8277 > evidence["context_length"] == CONTEXT
    assert broken.violations[0].fault is None
    assert broken.records[0].outcome == "failed" and "400" in broken.records[0].error.message

    repaired = _run("fixed", None, ["g00000-2"])
    _assert_clean(repaired)
    assert repaired.records[0].outcome == "completed" and len(repaired.requests) == 32


def test_text_without_logprobs() -> None:
    plan = plan_from_specs(NO_LOGPROBS, seed=4)
    broken = _run("unfixed", plan, [ONE])
    assert [(v.invariant, v.trajectory) for v in broken.violations] == [("token_alignment", ONE), ("provenance", ONE)]
    lost = broken.violations[1].evidence  # the text re-tokenized without the end-of-turn token it was served
    assert lost["kind"] == "missing" and lost["served_by"]["turn"] == 1
    assert lost["expected"] == load_tokenizer().eos_token_id
    evidence, fault = broken.violations[0].evidence, broken.violations[0].fault
    assert evidence["logprobs"] < evidence["response_ids"] == evidence["loss_mask"] == evidence["response_length"]
    assert fault is not None and fault["fault"] == "missing_logprobs"

    repaired = _run("fixed", plan, [ONE])
    _assert_clean(repaired)
    record = repaired.records[0]
    assert record.outcome == "aborted" and record.status == "ABORTED" and record.response_length > 0
    assert len(repaired.requests) == 2  # turn 1 had no logprobs: nothing after it


def test_oversized_tool_output() -> None:
    plan = plan_from_specs(HUGE_OUTPUT, seed=4)
    broken = _run("unfixed", plan, [ONE])
    assert [(v.invariant, v.trajectory) for v in broken.violations] == [("context_budget", ONE)]
    evidence, fault = broken.violations[0].evidence, broken.violations[0].fault
    assert evidence["response_length"] > 60000 and evidence["context_length"] == CONTEXT
    assert fault is not None and (fault["fault"], fault["turn"]) == ("oversized_tool_output", 1)
    assert broken.records[0].outcome == "truncated"

    repaired = _run("fixed", plan, [ONE])
    _assert_clean(repaired)
    record = repaired.records[0]
    assert record.outcome == "truncated" and record.prompt_length + record.response_length == CONTEXT
    assert record.loss_mask[-1] == 0 and record.logprobs[-1] == 0.0  # the trimmed tool output, masked


# -- the pieces --------------------------------------------------------------------------------------

def test_variants() -> None:
    assert resolve_target("ref-tool-loop:fixed").name == "ref-tool-loop:fixed"
    assert resolve_target("ref-tool-loop").name == "ref-tool-loop:unfixed"
    with pytest.raises(TargetError, match="unfixed and fixed"):
        resolve_target("ref-tool-loop:other")


def test_tool_calls_and_tool_message() -> None:
    text = ('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
            '\n<tool_call>\nnot json\n</tool_call>')
    assert parse_tool_calls(text) == [{"name": "bash", "arguments": {"command": "ls"}}]
    assert parse_tool_calls("no call here") == []
    assert tool_message(["out"]) == "\n<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>" \
                                    "\n<|im_start|>assistant\n"


def test_recorded_tools_answer_recorded_calls_and_emit_commands() -> None:
    tools = RecordedTools({"t": [[("bash", {"command": "ls"}, "a.py")]]}, {"t": 1.0})
    assert tools.run("t", 0, {"name": "bash", "arguments": {"command": "ls"}}) == "a.py"
    assert tools.run("t", 0, {"name": "bash", "arguments": {"command": "pwd"}}).startswith("error:")
    assert tools.run("t", 3, {"name": "bash", "arguments": {"command": "ls"}}).startswith("error:")
    assert tools.run("t", 0, {"name": "bash", "arguments": {"command": emit_command(12345)}}) == "x" * 12345
    assert tools.run("u", 0, {"name": "bash", "arguments": {"command": emit_command(3)}}) == "xxx"
    # a code tool's call (the fault speaks retool's protocol on a retool trace) prints as Python would
    assert tools.run("u", 0, {"name": "code_interpreter", "arguments": {"code": emit_code(5)}}) == "xxxxx\n"
    assert tools.run("u", 0, {"name": "code_interpreter", "arguments": {"code": "print(1)"}}).startswith("error:")


def _view(requests: list[RequestRecord]) -> RunView:
    return RunView([], requests, [], None, {"t": "g"}, CONTEXT, False)


def test_context_budget_reads_refused_requests() -> None:
    over = RequestRecord(0.0, "/generate", trajectory="t", turn=3, attempt=1, status=400, error=(
        "Requested token count exceeds the model's maximum context length of 8192 tokens. You requested a total of "
        "8277 tokens: 6229 tokens from the input messages and 2048 tokens for the completion. Please reduce ..."))
    too_long = RequestRecord(0.0, "/generate", trajectory="t", status=400, error=(
        "The input (9000 tokens) is longer than the model's context length (8192 tokens)."))
    # a context_length_error fault claims a smaller context: the request itself fits the real one
    claimed = RequestRecord(0.0, "/generate", trajectory="t", status=400, error=(
        "The input (540 tokens) is longer than the model's context length (540 tokens)."))
    vllm = RequestRecord(0.0, "/v1/completions", trajectory="t", status=400, error=(
        "This model's maximum context length is 8192 tokens. However, you requested 64 output tokens and your prompt "
        "contains 8150 input tokens, for a total of 8214 tokens."))
    found = context_budget.check(_view([over, too_long, claimed, vllm]))
    assert [(v.evidence["input_tokens"], v.evidence["max_new_tokens"]) for v in found] == [
        (6229, 2048), (9000, 0), (8150, 64)]
    assert found[0].evidence["turn"] == 3 and found[0].evidence["requested_total"] == 8277
    assert context_budget.check(_view([claimed, RequestRecord(0.0, "/generate", trajectory="t", status=200)])) == []
