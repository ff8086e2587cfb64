"""Known findings: declared violations are reported with their reason but do not fail the run; nothing else
is excused. The runs use `ref-tool-loop:unfixed` (appends tool outputs untrimmed) on agentic-500 without a
fault plan: four trajectories the trace recorded as `context_overflow` break `context_budget`, and five
recorded as completed break it too (their drifted conversations outgrow the context)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

# Imported before any inner pytester session: it restores sys.modules after each in-process run, and
# numpy (under pandas) cannot be imported a second time into the same process.
import bench.server  # noqa: F401
from bench import RunConfig, RunResult, run
from bench.cli import main as cli_main
from bench.invariants import Violation
from bench.orchestration.known import KnownFinding, KnownFindingsError, load_known, resolve_known, shipped_known
from bench.orchestration.repro import load_repro, write_repro
from bench.report import write_report
from bench.report.summary import format_summary
from tests.plans_for_tests import POISON_PLAN

pytest_plugins = ["pytester"]

OVERFLOWED = {"g00009-0", "g00013-3", "g00023-1", "g00023-3"}  # recorded outcome: context_overflow
GREW_PAST = {"g00000-2", "g00001-3", "g00007-2", "g00012-3", "g00019-0"}  # recorded as completed
OVERFLOW_ENTRY = """
[[known]]
invariant = "context_budget"
target = "ref-tool-loop:*"
recorded_outcome = "context_overflow"
reason = "the loop appends a recorded tool output that does not fit"
link = "https://example.invalid/issue/1"
"""


def _run(known: str | None) -> RunResult:
    config = RunConfig(trace="agentic-500", plan=None, target="ref-tool-loop:unfixed", n=100,
                       invariants=["context_budget"], known=known)
    return asyncio.run(run(config))


def _write(tmp_path: Path, text: str, name: str = "known.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def baseline() -> RunResult:
    return _run(None)


def test_the_runs_without_known_findings_fail_on_both_kinds(baseline: RunResult) -> None:
    assert {v.trajectory for v in baseline.violations} == OVERFLOWED | GREW_PAST
    assert {baseline.recorded_outcomes[t] for t in OVERFLOWED} == {"context_overflow"}
    assert {baseline.recorded_outcomes[t] for t in GREW_PAST} == {"completed"}
    assert not baseline.ok and baseline.known_violations == []


def test_a_known_finding_excuses_exactly_what_it_declares(tmp_path: Path) -> None:
    result = _run(str(_write(tmp_path, OVERFLOW_ENTRY)))
    assert {k.violation.trajectory for k in result.known_violations} == OVERFLOWED
    assert {v.trajectory for v in result.violations} == GREW_PAST  # recorded as completed: still new
    assert not result.ok
    repro = write_repro(result, tmp_path / "repro.toml")
    assert repro is not None and any(t in repro.read_text() for t in GREW_PAST)  # the repro is of a new one
    again = load_repro(repro, invariants=["context_budget"])
    assert again.config.known == str((tmp_path / "known.toml").resolve())  # the rerun knows the same findings


def test_a_run_whose_violations_are_all_known_passes_and_says_so(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ids = ", ".join(f'"{t}"' for t in sorted(GREW_PAST))
    known = _write(tmp_path, OVERFLOW_ENTRY + f"""
[[known]]
invariant = "context_budget"
trajectories = [{ids}]
reason = "drifted conversations outgrow the context"
""")
    result = _run(str(known))
    assert result.ok and result.violations == [] and result.known_file == str(known)
    assert len(result.known_violations) == len(OVERFLOWED | GREW_PAST)
    summary = write_report(result, tmp_path / "report")
    stored = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert stored["violations"] == [] and len(stored["known_violations"]) == 9
    by_trajectory = {k["trajectory"]: k for k in stored["known_violations"]}
    assert by_trajectory["g00023-3"]["reason"].startswith("the loop appends")
    assert by_trajectory["g00023-3"]["link"] == "https://example.invalid/issue/1"
    assert by_trajectory["g00000-2"]["known_by"] == "known.toml: entry 2"
    text = format_summary(summary)
    assert "known violations" in text and "x4: the loop appends" in text and "x5: drifted conversations" in text
    case = ET.parse(tmp_path / "report" / "junit.xml").getroot().find("testcase[@name='context_budget']")
    assert case is not None and case.find("failure") is None
    skipped = case.find("skipped")
    assert skipped is not None and "9 known" in skipped.get("message", "")
    assert write_repro(result, tmp_path / "repro.toml") is None
    assert cli_main(["report", str(tmp_path / "report")]) == 0  # `rollout-bench report DIR` says it too
    out = capsys.readouterr().out
    assert "known violations  9, declared in" in out and "x5: drifted conversations" in out


def test_matching_by_invariant_target_outcome_and_trajectory() -> None:
    on = Violation("context_budget", "t1", "over", {})
    run_level = Violation("liveness", None, "too slow", {})
    outcomes = {"t1": "context_overflow"}
    assert KnownFinding("context_budget", "r", "f").matches(on, "miles:patched", outcomes)
    assert not KnownFinding("token_alignment", "r", "f").matches(on, "miles:patched", outcomes)
    assert KnownFinding("context_budget", "r", "f", target="miles*").matches(on, "miles:patched", outcomes)
    assert not KnownFinding("context_budget", "r", "f", target="slime*").matches(on, "miles:patched", outcomes)
    assert not KnownFinding("context_budget", "r", "f", recorded_outcome="truncated").matches(on, "m", outcomes)
    assert not KnownFinding("context_budget", "r", "f", trajectories=("t2",)).matches(on, "m", outcomes)
    assert KnownFinding("liveness", "r", "f").matches(run_level, "m", outcomes)
    assert not KnownFinding("liveness", "r", "f", trajectories=("t1",)).matches(run_level, "m", outcomes)
    after = Violation("provenance", "t1", "missing", {}, fault={"fault": "missing_logprobs"})
    assert KnownFinding("provenance", "r", "f", fault="missing_logprobs").matches(after, "m", outcomes)
    assert not KnownFinding("provenance", "r", "f", fault="abort").matches(after, "m", outcomes)
    assert not KnownFinding("provenance", "r", "f", fault="missing_logprobs").matches(
        Violation("provenance", "t1", "missing", {}), "m", outcomes)  # no fault preceded it: not that finding


@pytest.mark.parametrize(("text", "expected"), [
    ("[[known]\n", "not valid TOML"),
    ('[[known]]\ninvariant = "context_budget"\n', "entry 1: reason is required"),
    ('[[known]]\nreason = "x"\n', "entry 1: invariant is required"),
    ('[[known]]\ninvariant = "context_budgets"\nreason = "x"\n', "invariant 'context_budgets' is not one of"),
    ('[[known]]\ninvariant = "context_budget"\nreason = "x"\n\n[[known]]\ninvariant = "liveness"\nreason = "y"\n'
     'outcome = "z"\n', "entry 2: unknown key(s) outcome"),
    ('[[known]]\ninvariant = "context_budget"\nreason = "x"\ntrajectories = "g1"\n', "trajectories must be"),
    ('[[known]]\ninvariant = "context_budget"\nreason = "x"\ntarget = 3\n', "target must be a string"),
    ('[[known]]\ninvariant = "provenance"\nreason = "x"\nfault = ["abort"]\n', "fault must be a string"),
    ('[[known]]\ninvariant = "provenance"\nreason = "x"\nfault = "missing_logprob"\n',
     "entry 1: fault: unknown fault 'missing_logprob'; valid faults: abort,"),
    ('[known]\ninvariant = "x"\n', "known must be an array of tables ([[known]]), got dict"),
    ('known = [1]\n', "entry 1: expected a table"),
    ('title = "x"\n', "unknown top-level key(s) title"),
    ("", "no [[known]] entries"),
])
def test_a_bad_file_names_itself_the_entry_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(KnownFindingsError) as caught:
        load_known(path)
    assert str(path) in str(caught.value) and expected in str(caught.value)


def test_shipped_files_load_and_names_resolve() -> None:
    assert "miles" in shipped_known()
    path, findings = resolve_known("miles")
    assert path == shipped_known()["miles"]
    assert [(f.invariant, f.target, f.recorded_outcome, f.fault) for f in findings] == \
        [("context_budget", "miles*", "context_overflow", None), ("provenance", "miles*", None, "missing_logprobs")]
    with pytest.raises(KnownFindingsError, match="not a shipped name .*miles"):
        resolve_known("nope")


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the default plan (seed-000) poisons g00120-3 only, outside the first 100 trajectories
    base = ["run", "--trace", "agentic-500", "--target", "ref-tool-loop:unfixed", "--n", "100",
            "--invariants", "context_budget"]
    known = _write(tmp_path, OVERFLOW_ENTRY)
    assert cli_main(base + ["--out", str(tmp_path / "a"), "--known", str(known)]) == 1  # five are new
    out = capsys.readouterr().out
    assert "known violations  4" in out and "x4: the loop appends" in out
    assert cli_main(base + ["--out", str(tmp_path / "b"), "--known", "no-such"]) == 2
    assert "not a shipped name" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()  # it failed before running anything


def test_a_repro_names_a_shipped_file_by_name(baseline: RunResult, tmp_path: Path) -> None:
    """An absolute path into one install would break the repro on another machine; the name resolves anywhere."""
    shipped = dataclasses.replace(baseline, config=dataclasses.replace(baseline.config, known="miles"),
                                  known_file=str(shipped_known()["miles"]))
    repro = write_repro(shipped, tmp_path / "repro.toml")
    assert repro is not None and 'known = "miles"' in repro.read_text()
    assert load_repro(repro).config.known == "miles"


def test_sweep_passes_known_findings_to_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = ", ".join(f'"{t}"' for t in sorted(OVERFLOWED | GREW_PAST))
    known = _write(tmp_path, f'[[known]]\ninvariant = "context_budget"\ntrajectories = [{ids}]\nreason = "r"\n')
    base = ["sweep", "--plan", "seed-000", "--target", "ref-tool-loop:unfixed", "--rates", "0", "--seeds", "1",
            "--n", "100", "--time-scale", "0", "--invariants", "context_budget", "--jobs", "1"]
    assert cli_main(base + ["--out", str(tmp_path / "bad"), "--known", str(tmp_path / "nope.toml")]) == 2
    assert "not a shipped name" in capsys.readouterr().err and not (tmp_path / "bad").exists()  # before any run
    assert cli_main(base + ["--out", str(tmp_path / "sweep"), "--known", str(known)]) == 0
    row = pd.read_csv(tmp_path / "sweep" / "sweep.csv").iloc[0]
    assert (row["outcome"], row["violations"], row["known_violations"]) == ("ok", 0, 9)


def test_bench_run_fixture_takes_known_findings(pytester: pytest.Pytester, small_agentic: Path) -> None:
    """`bench_run(..., known=)`: the poisoned trajectory's crash, declared known, passes; without it, fails."""
    pytester.makefile(".toml", poison=POISON_PLAN)
    pytester.makefile(".toml", crash='[[known]]\ninvariant = "batch_survival"\nreason = "the gather crashes"\n')
    pytester.makepyfile(test_known_run=f"""
        import pytest

        @pytest.mark.bench_trace({str(small_agentic)!r})
        @pytest.mark.bench_plan("poison.toml")
        def test_known(bench_run):
            result = bench_run("ref-gather:unfixed", isolation="inline", known="crash.toml",
                               invariants=["batch_survival"])
            assert result.ok and result.repro_path is None
            assert [k.violation.invariant for k in result.known_violations] == ["batch_survival"]
            assert "known violations (not failures): 1" in result.explain()
            plain = bench_run("ref-gather:unfixed", isolation="inline", invariants=["batch_survival"])
            assert plain.violated == {{"batch_survival"}} and plain.repro_path is not None
    """)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
