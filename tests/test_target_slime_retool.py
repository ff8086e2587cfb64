"""The `slime-retool` target: slime's retool example (its own prompt, tool calls and sandbox) driven by a retool
trace, under seed-004 (slime#1861), at slime commits before and after #1861.

The checkout-based tests run when `ROLLOUT_BENCH_SLIME_RETOOL_CHECKOUTS` lists slime checkouts (os.pathsep
between them; else `ROLLOUT_BENCH_SLIME_PATH`'s one) and the slime environment is built (`make slime-env`).
Each checkout is judged by what its retool has: no per-turn clamp is before #1861 (THUDM/slime 5b326e6), the
clamp without the PENDING guard on the final status is #1861 itself (41dc3b6), both is later (624b824).
The other tests need neither.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from bench import RunConfig, RunResult, run
from bench.records.request_log import RequestRecord
from bench.records.sample import SampleRecord
from bench.replay.answer import Generation
from bench.replay.identify import Identity
from bench.report.status import HONEST, status_verdicts
from bench.synth import synthesize
from bench.synth import retool_format
from bench.targets import resolve_target
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.slime.family import OptionError, split_tokens
from bench.targets.frameworks.slime.target import PATH_ENV
from bench.targets.frameworks.slime_retool.target import SlimeRetool
from bench.tokenizer import load_tokenizer
from bench.trace import open_trace, validate_trace
from bench.trace.shipped import shipped_trace
from faults import Exchange, resolve_plan
from faults.catalogue.oversized_tool_output import OversizedToolOutput
from faults.hooks import emit_command
from tests.checkout_helpers import listed_checkouts, needs_checkouts

CHECKOUTS_ENV = "ROLLOUT_BENCH_SLIME_RETOOL_CHECKOUTS"
CHECKOUTS = listed_checkouts(CHECKOUTS_ENV, PATH_ENV)
PYTHON = target_python("slime-retool")
needs_retool = needs_checkouts("slime", CHECKOUTS, PYTHON, CHECKOUTS_ENV, PATH_ENV, "make slime-env")
RETOOL = "examples/retool/generate_with_retool.py"
# seed-004 on retool-64's first five groups: g00000-2, g00001-0 and g00004-0 get the 60000-byte tool call;
# g00000-1 and g00002-1 lose their logprobs at turn 1 (g00002-2 at turns 0 and 1); g00002-2, g00004-0 and
# g00004-1 are aborted once (retried by the requeueing manager).
SEED_004 = [f"g{g:05d}-{m}" for g in range(5) for m in range(4)]
HUGE = {"g00000-2", "g00001-0", "g00004-0"}
tok = load_tokenizer()


def _commit_kind(checkout: Path) -> str:
    source = (checkout / RETOOL).read_text(encoding="utf-8")
    if "remaining_budget" not in source:
        return "before-1861"
    return "later" if "if sample.status is Sample.Status.PENDING" in source else "1861"


def _run(checkout: Path, variant: str = "unfixed") -> RunResult:
    config = RunConfig(trace="retool-64", plan=resolve_plan("seed-004"), target=f"slime-retool:{variant}",
                       trajectories=SEED_004, python=PYTHON, watchdog_s=180.0, time_scale=0.05,
                       target_options={"source": str(checkout)})
    result = asyncio.run(run(config))
    error = result.batch_error
    print(f"{checkout} {variant}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, "
          f"batch error {error and (error.type, error.message, error.trajectory)}")
    return result


# -- without a checkout --------------------------------------------------------------------------------------


def test_a_retool_trace_holds_the_raw_question_and_retools_rendering(tmp_path: Path) -> None:
    path = synthesize("retool", 8, 2, tmp_path / "r.jsonl")
    assert list(validate_trace(path)) == []
    with open_trace(path) as reader:
        trajectories = list(reader)
    for trajectory in trajectories:
        prompt = trajectory.prompt
        assert prompt.raw and prompt.text == retool_format.render_prompt(prompt.raw) and prompt.raw in prompt.text
        assert prompt.ids == tok.encode(prompt.text) and prompt.tools == retool_format.TOOLS
        for turn, following in zip(trajectory.turns, trajectory.turns[1:]):
            for call, output in zip(turn.tool_calls, turn.tool_outputs):
                code = json.loads(call.arguments)[retool_format.CODE_ARGUMENT]
                assert retool_format.tool_call_text(code) in turn.response.text
                assert output.text == retool_format.run_code(code) and output.text.startswith("Output:\n")
            observed = "".join(retool_format.observation(out.text) for out in turn.tool_outputs)
            assert following.request.input_ids_append == tok.encode(observed)  # tokenized on its own, as retool does
        assert "Answer: \\boxed{" in trajectory.turns[-1].response.text or trajectory.metadata["outcome"] == "truncated"


def test_the_oversized_tool_call_speaks_the_trajectorys_tool_protocol() -> None:
    def faulted(tools: tuple[str, ...]) -> str:
        generation = Generation(Identity("g00000-0", "g00000", 1, 1), [1, 2], None, "hi", None, 10, 0, 0.0, 0.0)
        exchange = Exchange(api="native", flavor="sglang", endpoint="/generate", stream=False, generation=generation,
                            weight_version="0", context_length=4096, tokenizer=tok, tools=tools)
        OversizedToolOutput(bytes=3000).apply(exchange)
        return generation.text

    code_call = faulted(("code_interpreter",))
    assert retool_format.tool_call_text("print('x' * 3000)") in code_call
    assert retool_format.run_code("print('x' * 3000)") == "Output:\n" + "x" * 3000  # what retool's sandbox returns
    assert f'"name": "bash", "arguments": {json.dumps({"command": emit_command(3000)})}' in faulted(("bash",))
    assert '"name": "bash"' in faulted(())  # no tools announced: the shell protocol, as before


def test_status_honesty_names_a_completed_sample_cut_at_the_context_or_by_length() -> None:
    records = [SampleRecord("at-context", "g", "completed", "COMPLETED", 100, response_length=412,
                            loss_mask=[1] * 400 + [0] * 12),  # a tool output trimmed at the context
               SampleRecord("stopped-there", "g", "completed", "COMPLETED", 100, response_length=412,
                            loss_mask=[1] * 412),  # the model's own stop is the context's last token
               SampleRecord("by-length", "g", "completed", "COMPLETED", 100, response_length=50),
               SampleRecord("truncated", "g", "truncated", "TRUNCATED", 100, response_length=412),
               SampleRecord("finished", "g", "completed", "COMPLETED", 100, response_length=50),
               SampleRecord("lost", "g", "lost")]
    requests = [RequestRecord(0.0, "/generate", trajectory="by-length", turn=0, finish="stop", status=200, seq=0),
                RequestRecord(0.0, "/generate", trajectory="by-length", turn=1, finish="length", status=200, seq=3),
                RequestRecord(0.0, "/generate", trajectory="finished", turn=0, finish="length", status=200, seq=1),
                RequestRecord(0.0, "/generate", trajectory="finished", turn=1, finish="stop", status=200, seq=2),
                RequestRecord(0.0, "/generate", trajectory="at-context", turn=0, finish="stop", status=200, seq=4),
                RequestRecord(0.0, "/generate", trajectory="stopped-there", turn=0, finish="stop", status=200, seq=5),
                RequestRecord(0.0, "/generate", trajectory="stopped-there", turn=1, status=503, seq=6)]  # no answer
    verdicts = status_verdicts(records, requests, 512)
    assert verdicts == {"at-context": "COMPLETED though cut at the context (512 of 512 tokens)",
                        "by-length": "COMPLETED though its last answer (turn 1) was cut by length",
                        "truncated": HONEST, "finished": HONEST, "stopped-there": HONEST}


def test_response_ids_come_from_the_sample_split_at_the_prompt_the_framework_sent() -> None:
    assert split_tokens([1, 2, 3, 4, 5], 2, [1, 2, 3]) == (3, [4, 5], True)
    assert split_tokens([1, 2, 3, 4, 5, 6], 2, [1, 2, 3]) == (3, [4, 5, 6], True)  # disagreeing length shows
    assert split_tokens([9, 9, 4, 5], 2, [1, 2, 3]) == (2, [4, 5], False)  # another rendering: the Sample's split
    assert split_tokens([], 0, [1, 2, 3]) == (3, [], False)


def test_a_checkout_without_the_retool_example_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slime" / "rollout").mkdir(parents=True)
    (tmp_path / "slime" / "rollout" / "sglang_rollout.py").write_text("")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "slime", raising=False)
    with pytest.raises(OptionError, match="no examples/retool/generate_with_retool.py there"):
        SlimeRetool().prepare({"source": str(tmp_path)})


# -- with checkouts -------------------------------------------------------------------------------------------

SANDBOX_CHECK = textwrap.dedent('''
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1] + "/examples/retool")
    import tool_sandbox
    from bench.trace import open_trace

    async def main():
        results = {}
        with open_trace(sys.argv[2]) as reader:
            for trajectory in reader:
                for turn in trajectory.turns:
                    for call, output in zip(turn.tool_calls, turn.tool_outputs):
                        code = json.loads(call.arguments)["code"]
                        got = await tool_sandbox.tool_registry.execute_tool("code_interpreter", {"code": code})
                        results[code] = [got, output.text]
        print(json.dumps(results))

    asyncio.run(main())
''')


@needs_retool
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_the_shipped_tool_outputs_are_what_retools_own_sandbox_prints(checkout: Path) -> None:
    done = subprocess.run([PYTHON, "-c", SANDBOX_CHECK, str(checkout), str(shipped_trace("retool-64"))],
                          capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) >= 20 and all(got == recorded for got, recorded in results.values()), results


@needs_retool
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_seed_004_on_retool(checkout: Path) -> None:
    kind = _commit_kind(checkout)
    result = _run(checkout)
    fired = Counter(e.fault for e in result.fault_events)
    assert fired["missing_logprobs"] >= 1 and fired["abort"] >= 1
    assert result.framework is not None and result.framework["source"] == str(checkout.resolve())
    if kind == "before-1861":
        # text without logprobs: retool re-tokenizes the text and its own assert finds the desync, which takes
        # the whole rollout down (a bare gather), raised by a sample the fault reached
        error = result.batch_error
        assert error is not None and error.type == "AssertionError" and "Token/logp length mismatch" in error.message
        assert {v.invariant for v in result.violations} == {"batch_survival"}
        raiser = error.trajectory
        assert raiser in {e.trajectory for e in result.fault_events if e.fault == "missing_logprobs"}
        return
    assert result.violations == [] and result.batch_error is None
    by_id = {r.trajectory: r for r in result.records}
    assert set(by_id) == set(SEED_004)
    for record in result.records:  # aligned, within budget, never a stale resubmission
        assert record.outcome in ("completed", "truncated", "aborted")
        assert len(record.response_ids) == len(record.loss_mask) == record.response_length == len(record.logprobs)
        assert record.prompt_length + record.response_length <= result.context_length
    aborted_once = {r.trajectory for r in result.requests if r.finish == "abort"}  # answered with an abort
    assert aborted_once and all(by_id[t].details["generate_calls"] >= 2 for t in aborted_once), \
        {t: by_id[t].details["generate_calls"] for t in aborted_once}  # requeued, then generated afresh
    x = tok.encode("x")[0]
    honesty = status_verdicts(result.records, result.requests, result.context_length)
    for trajectory in HUGE:  # the 60000-byte output came from retool's sandbox, trimmed at the context
        record = by_id[trajectory]
        assert record.prompt_length + record.response_length == result.context_length
        assert record.response_ids[-50:] == [x] * 50 and record.loss_mask[-50:] == [0] * 50
        if kind == "1861":  # trimmed, then its final status match overwrote TRUNCATED with the last answer's stop
            assert record.status == "COMPLETED"
            assert honesty[trajectory] == f"COMPLETED though cut at the context ({result.context_length} of " \
                                          f"{result.context_length} tokens)"
        else:
            assert record.status == "TRUNCATED" and honesty[trajectory] == HONEST
    assert all(honesty[t] == HONEST for t in set(SEED_004) - HUGE)


@needs_retool
@pytest.mark.parametrize("checkout", [c for c in CHECKOUTS if _commit_kind(c) == "before-1861"] or [None],
                         ids=str)
def test_seed_004_before_1861_patched_shows_every_desync(checkout: Path | None) -> None:
    """With the group gather fixed (a raising sample leaves an ABORTED placeholder), the rest of the rollout
    comes back and shows the other desyncs: the oversized tool output appended untrimmed past the context, a
    sample trained on fewer logprobs than tokens, and a retried sample carrying its first attempt's logprobs."""
    if checkout is None:
        pytest.skip(f"no checkout before #1861 among {', '.join(map(str, CHECKOUTS))}")
    result = _run(checkout, "patched")
    assert result.batch_error is None
    over = {v.trajectory: v.evidence for v in result.violations if v.invariant == "context_budget"}
    assert set(over) == HUGE and all(e["response_length"] > 60000 for e in over.values())
    misaligned = [v.evidence for v in result.violations if v.invariant == "token_alignment"]
    assert misaligned and all(e["logprobs"] < e["response_ids"] for e in misaligned)
    placeholders = [r for r in result.records if r.outcome == "aborted"]
    assert placeholders and all(r.error.type == "AssertionError" and r.response_length == 1 for r in placeholders)
    stale = [r for r in placeholders if r.trajectory in {e.trajectory for e in result.fault_events if e.fault == "abort"}
             and _logps_over_tokens(r.error.message)]
    assert stale, [r.error.message for r in placeholders]  # the retried sample appended to its old logprobs
    assert not [v for v in result.violations if v.trajectory in {r.trajectory for r in placeholders}]


def _logps_over_tokens(message: str) -> bool:
    """`Token/logp length mismatch at turn T: A tokens vs B logps` with B > A: logprobs left from an attempt before."""
    words = message.split()
    tokens, logps = int(words[words.index("tokens") - 1]), int(words[words.index("logps") - 1])
    return logps > tokens


def test_a_trace_without_raw_prompts_is_refused_before_retool_loads() -> None:
    """The agentic trace (the bench's own template, no raw question) would drift retool to turn 0 on every
    request: refused at warm-up, naming the trace, the trajectory and the way out."""
    target = resolve_target("slime-retool")
    with pytest.raises(OptionError, match=r"trajectory g00000-0 has no raw prompt.*--trace retool-64"):
        target.warm_up({"trace": str(shipped_trace("agentic-500")), "source": "/nonexistent"})
