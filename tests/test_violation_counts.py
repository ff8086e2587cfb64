"""Violations are counted per trajectory (issue 13): a check that fires once per request reports each
trajectory once, with the number of occurrences, in the run, summary.json and the terminal."""

from __future__ import annotations

from bench import SampleRecord
from bench.invariants import Bounds, RunView, check_all
from bench.records.request_log import RequestRecord
from bench.report.summary import format_summary

CONTEXT = 1000


def _refused(trajectory: str, turn: int) -> RequestRecord:
    message = (f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. You "
               f"requested a total of 1200 tokens: 900 tokens from the input messages and 300 tokens for the "
               f"completion. Please reduce the number of tokens in the input messages or the completion to fit "
               f"within the limit.")
    return RequestRecord(started=float(turn), endpoint="/generate", trajectory=trajectory, group="g0", turn=turn,
                         attempt=1, status=400, error=message)


def _view() -> RunView:
    trajectories = ["g0-0", "g0-1"]
    requests = [_refused(t, turn) for t in trajectories for turn in range(30)]
    records = [SampleRecord(t, "g0", "failed", prompt_length=900) for t in trajectories]
    return RunView(records, requests, [], None, {t: "g0" for t in trajectories}, CONTEXT, False,
                   bounds=Bounds(max_requests_per_trajectory=100))


def test_one_violation_per_trajectory_with_its_occurrences() -> None:
    violations = [v for v in check_all(_view()) if v.invariant == "context_budget"]
    assert [(v.trajectory, v.occurrences) for v in violations] == [("g0-0", 30), ("g0-1", 30)]
    assert violations[0].evidence["turn"] == 0  # the first occurrence's evidence


def test_the_terminal_counts_trajectories_and_occurrences() -> None:
    violations = [v.to_dict() for v in check_all(_view(), ["context_budget"])]
    summary = {"target": "t", "plan": None, "seed": None, "trajectories": 2, "outcomes": {"failed": 2},
               "drop_rate": 1.0, "drop_rate_by_fault": {}, "batch_error": None, "hang": None,
               "violations": violations, "throughput": {"trajectories_per_s": 1, "requests_per_s": 1,
                                                        "output_tokens_per_s": 0}}
    text = format_summary(summary)
    assert "2 on 2 trajectories: context_budget 2 (60 occurrences)" in text
    assert text.count("context_budget") == 3 and "(x30)" in text
