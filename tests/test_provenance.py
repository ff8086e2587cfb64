"""Provenance (issue 14): every token a sample trains on is a token the server served it, in order, from its final
attempt; every logprob is the one served. Plug-in targets in tests/provenance_targets.py hold exactly what they
were served (no violation may appear), or alter it after a valid reply in one way each (it must be named)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from provenance_targets import CHANGED, DOUBLED, ROUTES, ZEROED

from bench import RunConfig, RunResult, run_blocking
from bench.invariants import provenance
from bench.report import load, write_report
from bench.server import openai_answer
from bench.targets import TargetError
from faults import plan_from_specs

ROOT = Path(__file__).resolve().parent.parent


def _run(target: str, faults: list[str] | None = None, n: int = 48, route: str = "native",
         isolation: str = "inline", trace: str = "rlvr-500") -> RunResult:
    plan = plan_from_specs(faults, seed=14) if faults else None
    return run_blocking(RunConfig(trace=trace, plan=plan, target=f"tests.provenance_targets:{target}", n=n,
                                  isolation=isolation, target_options={"route": route}))


def _provenance(result: RunResult) -> dict[str, dict]:
    return {v.trajectory: v.evidence | {"message": v.message}
            for v in result.violations if v.invariant == "provenance"}


@pytest.mark.parametrize("route", ROUTES)
def test_three_altered_samples_are_named_on_every_route(route: str) -> None:
    """The issue's user test: every sample completes, three are altered after a valid reply. Before provenance
    only the zeroed logprobs were flagged (by token_alignment's heuristic) and the run passed otherwise."""
    result = _run("Corrupts", route=route)
    found = _provenance(result)
    assert set(found) == {CHANGED, ZEROED, DOUBLED}
    changed = found[CHANGED]
    assert changed["kind"] == "never served" and changed["got"] == changed["expected"] + 1
    assert changed["served_by"]["trajectory"] == CHANGED and changed["served_by"]["turn"] == 0
    assert changed["position"] == changed["served_by"]["from"] > 0  # the middle token, where it was served
    zeroed = found[ZEROED]
    assert zeroed["kind"] == "logprob differs" and zeroed["got"] == 0.0 and zeroed["expected"] < 0
    doubled = found[DOUBLED]
    assert doubled["kind"] == "repeated" and doubled["expected"] is None  # served once, held twice
    assert [c["from"] for c in doubled["composition"]] == [0, 0]
    # the 45 others hold exactly what they were served, tokens and logprobs
    assert sum(label == "match (tokens+logprobs)" for label in result.provenance.values()) == 45


def test_logprobs_kept_as_float32_are_within_tolerance() -> None:
    result = _run("Float32Logprobs")
    assert not _provenance(result) and set(result.provenance.values()) == {"match (tokens+logprobs)"}


def test_vllm_chat_sentinel_for_a_null_logprob_is_not_invented() -> None:
    """vLLM's chat route writes a missing logprob as -9999.0: a client keeping it holds what it was shown."""
    assert provenance.NO_LOGPROB_SENTINEL == openai_answer.SENTINEL  # the server's clamp, kept apart from it
    result = _run("Honest", ["null_logprob:p=0.25,position=3"], route="chat")
    hit = {e.trajectory for e in result.fault_events}
    assert hit and not _provenance(result)
    assert all(next(r for r in result.records if r.trajectory == t).logprobs[3] == -9999.0 for t in hit)


@pytest.mark.parametrize("fault", ["missing_logprobs:p=0.25", "null_logprob:p=0.25,position=3"])
def test_a_logprob_the_answer_did_not_show_is_invented(fault: str) -> None:
    result = _run("FillsMissingLogprobs", [fault])
    hit = {e.trajectory for e in result.fault_events}
    found = _provenance(result)
    assert hit and set(found) == hit
    for evidence in found.values():
        assert evidence["kind"] == "logprob invented" and evidence["expected"] is None and evidence["got"] == 0.0
        assert evidence["position"] == (0 if fault.startswith("missing") else 3)
    honest = _run("Honest", [fault])  # left as served (none, or one null), the same samples pass
    assert not _provenance(honest)
    if fault.startswith("missing"):  # without logprobs, they are checked on their tokens only
        assert {t for t, label in honest.provenance.items() if label == "match (tokens)"} == hit


def test_logprob_entries_that_disagree_with_the_ids() -> None:
    """`logprob_length_mismatch`: the answer's logprob entries are one short of (or two beyond) its ids. A client
    reading tokens and logprobs from the entries holds what they showed: no violation. One taking ids from
    `output_ids` and logprobs from the entries holds every served token, and no logprob where none was shown:
    provenance holds, and token_alignment names the sample whose logprobs are one short."""
    for delta in (-1, 2):
        from_entries = _run("Honest", [f"logprob_length_mismatch:p=0.3,delta={delta}"])
        assert from_entries.fault_events and not _provenance(from_entries)
        assert set(from_entries.provenance.values()) == {"match (tokens+logprobs)"}
    mixed = _run("Honest", ["logprob_length_mismatch:p=0.3,delta=-1"], route="native-output-ids")
    assert not _provenance(mixed)
    short = {v.trajectory for v in mixed.violations if v.invariant == "token_alignment"}
    assert short == {e.trajectory for e in mixed.fault_events}


def test_tokens_served_to_another_trajectory() -> None:
    result = _run("SwapsWithNeighbour", n=8)
    found = _provenance(result)
    assert set(found) == {"g00000-1", "g00001-1"}
    assert found["g00000-1"]["kind"] == "another trajectory" and "g00001-1" in found["g00000-1"]["message"]
    assert found["g00000-1"]["got_from"]["trajectory"] == "g00001-1"


def test_an_aborted_attempt_kept_in_front_of_the_retry() -> None:
    """slime#1861's stale retry without a trajectory header: identical group requests are told apart by arrival
    order only, and still the kept attempt is named."""
    stale = _run("KeepsAbortedAttempt", ["abort:keep=0.5,p=0.3"])
    aborted = {r.trajectory for r in stale.requests if r.finish == "abort"}
    found = _provenance(stale)
    assert found and all(v["kind"] == "earlier attempt" for v in found.values())
    first = next(iter(found.values()))["composition"][0]
    assert first["final_attempt"] is False and first["tokens"] > 0
    assert len(found) >= len(aborted) // 2  # most aborted trajectories; the rest aborted twice or at token 0


@pytest.mark.parametrize("target", ["keeps_aborted_fresh", "keeps_aborted_partial"])
def test_a_correct_retry_or_partial_rollout_is_not_blamed(target: str) -> None:
    """Fresh: the retry's tokens only (which member's answer it was is a guess: any of the group's counts, once).
    Partial: the retry resumes from the aborted output, so the sample is both requests' tokens in order."""
    result = _run(target, ["abort:keep=0.5,p=0.3"])
    assert any(r.finish == "abort" for r in result.requests)
    assert not _provenance(result)
    assert set(result.provenance.values()) == {"match (tokens+logprobs)"}
    if target == "keeps_aborted_partial":
        assert any(r.continues is not None and r.turn == 0 for r in result.requests)


def test_tool_output_counted_as_model_tokens() -> None:
    ok = _run("ToolLoop", n=8)
    assert not _provenance(ok) and set(ok.provenance.values()) == {"match (tokens+logprobs)"}
    bad = _run("ToolCountedAsModel", n=8)
    found = _provenance(bad)
    assert set(found) == {r.trajectory for r in bad.records}
    for trajectory, evidence in found.items():
        record = next(r for r in bad.records if r.trajectory == trajectory)
        first_turn = next(r for r in bad.requests if r.trajectory == trajectory and r.turn == 0)
        assert evidence["kind"] == "never served" and evidence["position"] == first_turn.served_tokens
        assert evidence["response_index"] == first_turn.served_tokens < record.response_length


def test_a_turn_kept_out_of_training_is_fine_a_turn_lost_is_not() -> None:
    masked = _run("MasksFirstTurn", n=8)
    assert not _provenance(masked) and set(masked.provenance.values()) == {"match (tokens+logprobs)"}
    lost = _run("LosesSecondTurn", n=8)
    found = _provenance(lost)
    assert set(found) == {r.trajectory for r in lost.records}
    assert {v["kind"] for v in found.values()} == {"missing"}
    assert {v["served_by"]["turn"] for v in found.values()} == {1}


def test_a_retokenizing_framework_is_compared_as_text_and_says_so() -> None:
    honest = _run("Retokenizes", n=16, isolation="process")  # the declaration crosses the worker's hello
    assert not _provenance(honest) and set(honest.provenance.values()) == {"match (text)"}
    lossy = _run("RetokenizesLossy", n=16)
    found = _provenance(lossy)
    assert set(found) == {CHANGED} and found[CHANGED]["kind"] == "text"
    assert found[CHANGED]["check"] == "text" and "character" in found[CHANGED]["message"]
    with pytest.raises(TargetError, match="tokens_source 'text' is not one of served, retokenized"):
        _run("BadTokensSource", n=4)


def test_samples_that_train_on_nothing_are_reported_not_checked() -> None:
    result = _run("Honest", ["http_error:status=500,p=0.2"], n=24)  # a bare gather: one error loses the batch
    assert {r.outcome for r in result.records} == {"lost"}
    assert set(result.provenance.values()) == {"not checked: not a training sample (lost)"}
    zeroed = _run("ToolLoop", ["abort:keep=0.5,p=1,turns=0"], n=4)  # nothing under loss mask 1
    assert not _provenance(zeroed)


def test_report_keeps_the_served_arrays_and_the_per_fault_view(tmp_path: Path) -> None:
    result = _run("Corrupts", ["missing_logprobs:p=0.1"])
    write_report(result, tmp_path)
    report = load(tmp_path)
    requests, trajectories, served = report["requests"], report["trajectories"], report["served"]
    assert {"served_tokens", "served_digest", "weight_version", "logprobs_served", "continues"} <= set(requests)
    honest = trajectories[trajectories["provenance"] == "match (tokens+logprobs)"]
    record = next(r for r in result.records if r.trajectory == honest["trajectory"].iloc[0])
    row = requests[requests["trajectory"] == record.trajectory].iloc[-1]
    assert list(served.tokens(int(row["seq"]))) == record.response_ids
    assert np.allclose(served.token_logprobs(int(row["seq"])), record.logprobs)
    assert row["served_tokens"] == len(record.response_ids) and len(row["served_digest"]) == 16
    summary = report["summary"]["provenance"]
    assert summary["mismatch"] == 3 and summary["match"] == 45 and summary["served_tokens"] == len(served.ids)
    missing = summary["by_fault"]["missing_logprobs"]
    hit = trajectories["faults"].fillna("").str.contains("missing_logprobs")
    assert missing["checked"] == int(hit.sum()) and missing["mismatch"] == int(
        (hit & trajectories["provenance"].str.startswith("mismatch")).sum())
    case = next(c for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase") if c.get("name") == "provenance")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["provenance.mismatch"] == "3"
    assert properties["provenance.mismatch.missing_logprobs"] == f"{missing['mismatch']} of {missing['checked']}"
    assert case.find("failure") is not None and "mismatch by fault type" in case.find("failure").text


def test_the_command_line_fails_the_run_and_prints_the_per_fault_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "tests.provenance_targets:Corrupts",
                           "--trace", "rlvr-500", "--n", "16", "--fault", "missing_logprobs:p=0.5",
                           "--repro-reruns", "0",
                           "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.strip().startswith("provenance "))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["provenance"]
    checks = ", ".join(f"{k} {v}" for k, v in summary["checks"].items())
    assert line.split(None, 1)[1].startswith(f"16 checked ({checks}): 15 match, 1 mismatch; 0 not checked")
    mismatch = [f for f, stats in summary["by_fault"].items() if stats["mismatch"]]
    assert len(mismatch) == 1 and f"mismatch by fault: {mismatch[0]} 1 of" in line
    # CI's view: the JUnit failure of a finding an injected fault preceded names that fault, where and by which rule
    import xml.etree.ElementTree as ET

    cases = {case.get("name"): case.find("failure") for case in ET.parse(tmp_path / "run" / "junit.xml").getroot()}
    alignment = json.loads((tmp_path / "run" / "summary.json").read_text())["violations"]
    preceded = next(v for v in alignment if v["invariant"] == "token_alignment" and v["fault"])
    assert (f"{preceded['trajectory']}: {preceded['message']} (after the injected fault missing_logprobs, rule "
            f"{preceded['fault']['rule']}, turn {preceded['fault']['turn']}") in (cases["token_alignment"].text or "")


def test_the_provenance_line_names_its_checks_and_leaves_out_empty_brackets() -> None:
    from bench.report.summary import _provenance_line

    nothing = {"match": 0, "mismatch": 0, "checks": {}, "not_checked": {"lost": 3}, "by_fault": {}}
    assert _provenance_line(nothing) == "0 checked: 0 match, 0 mismatch; 3 not checked"
    some = {**nothing, "match": 2, "checks": {"tokens+logprobs": 2}}
    assert _provenance_line(some) == "2 checked (tokens+logprobs 2): 2 match, 0 mismatch; 3 not checked"
