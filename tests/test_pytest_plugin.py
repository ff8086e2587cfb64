"""The pytest plugin seen from outside (pytester): failure output, command-line options, profiles.

Inner sessions run on an 8-trajectory trace with a plan that poisons one named trajectory
(no `p`, so it fires whatever the seed): ref-gather:unfixed then always crashes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# Imported here, before any inner session: pytester restores sys.modules after each in-process
# run, and numpy (under pandas) cannot be imported a second time into the same process.
import bench.orchestration.repro  # noqa: F401
import bench.report  # noqa: F401
import bench.server  # noqa: F401
from tests.plans_for_tests import POISON_PLAN

pytest_plugins = ["pytester"]


@pytest.fixture
def bench_dir(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", poison=POISON_PLAN)
    return pytester


def _source(text: str, trace: Path) -> str:
    return text.replace("TRACE", repr(str(trace)))


def test_failing_bench_test_shows_seed_evidence_and_repro(bench_dir: pytest.Pytester, small_agentic: Path,
                                                          tmp_path: Path) -> None:
    bench_dir.makepyfile(test_crash=_source("""
        import pytest

        @pytest.mark.bench_trace(TRACE)
        @pytest.mark.bench_plan("poison.toml")
        def test_crash(bench_run):
            result = bench_run("ref-gather:unfixed", isolation="inline")
            assert result.ok
    """, small_agentic))
    reports = tmp_path / "reports"
    outcome = bench_dir.runpytest("--bench-seed", "11", "--bench-report-dir", str(reports))
    outcome.assert_outcomes(failed=1)
    text = outcome.stdout.str()
    print(text)
    assert re.search(r"-+ rollout-bench -+", text), "no rollout-bench report section"
    assert "plan poison, seed 11" in text
    assert "violation 1/1: batch_survival [g00001-2]" in text
    assert '"error_type": "InjectedFault"' in text  # the evidence, not only the name
    assert "after fault: raise_after_generate (rule poison-one) on g00001-2 turn 0 attempt 1" in text
    assert "batch error: InjectedFault" in text and "raised by g00001-2 after the injected fault" in text
    assert "Traceback (most recent call last)" in text and "in raise_if_poisoned" in text  # the line that raised
    repro = re.search(r"  repro: (\S+)", text)
    assert repro is not None
    repro_path = Path(repro.group(1))
    assert repro_path.is_file() and repro_path.is_relative_to(reports)
    assert "seed = 11" in repro_path.read_text() and 'invariant = "batch_survival"' in repro_path.read_text()
    assert f"rerun: rollout-bench run --repro {repro_path}" in text
    assert (repro_path.parent / "summary.json").is_file()
    assert "rollout-bench: 1 runs, 1 with violations" in text


STEP_PLAN = """
name = "step-one-fails"
seed = 5

[[rules]]
name = "step-1-500"
fault = "http_error"
status = 500
p = 1
steps = "1"
"""


def test_a_step_finding_fails_the_test_with_its_evidence_and_repro(bench_dir: pytest.Pytester,
                                                                   tmp_path: Path) -> None:
    """`bench_run(target, steps=K, on_step_failure=...)`: every request of step 1 fails, ref-step-singleton:unfixed
    (fail-fast) fails step 1, and its dirtied singleton fails step 2 on valid replies. The plugin reports that as it
    reports any failure: the test fails, its rollout-bench section has the step finding with its evidence, and a
    repro of steps 0-2 the bench reran."""
    bench_dir.makefile(".toml", steps=STEP_PLAN)
    bench_dir.makepyfile(test_bench_steps="""
        import pytest

        @pytest.mark.bench_plan("steps.toml")
        def test_three_steps(bench_run):
            result = bench_run("ref-step-singleton:unfixed", steps=3, n=4, on_step_failure="continue", warm=False,
                               watchdog_s=20.0)
            assert result.run.steps["ran"] == 3
            assert result.ok
    """)
    reports = tmp_path / "reports"
    outcome = bench_dir.runpytest("--bench-report-dir", str(reports))
    outcome.assert_outcomes(failed=1)
    text = outcome.stdout.str()
    print(text)
    assert re.search(r"-+ rollout-bench -+", text), "no rollout-bench report section"
    assert re.search(r"violation 1/1: step_carryover \[[^\]]+\] step 2 failed after step 1 had failed "
                     r"\(ClientResponseError\)", text), text
    assert "passes in a fresh process: carried over" in text
    assert '"after_step": 1' in text and "RolloutAborted" in text  # the evidence, not only the name
    repro = re.search(r"  repro: (\S+)", text)
    assert repro is not None, "no repro for the step finding"
    written = Path(repro.group(1)).read_text()
    assert "steps = 3" in written and 'on_step_failure = "continue"' in written
    assert 'invariant = "step_carryover"' in written and "verified = {reruns = 1," in written
    assert "rollout-bench: 1 runs, 1 with violations" in text


def test_command_line_options_take_effect(bench_dir: pytest.Pytester, small_agentic: Path, tmp_path: Path) -> None:
    bench_dir.makepyfile(test_options=_source("""
        import pytest
        from pathlib import Path

        @pytest.mark.bench_trace(TRACE)
        def test_plan_and_seed_from_the_command_line(bench_plan, bench_run, request):
            assert bench_plan.name == "poison" and bench_plan.seed == 11
            result = bench_run("ref-gather:fixed", isolation="inline")
            assert result.seed == 11 and result.ok and [e.trajectory for e in result.fault_events] == ["g00001-2"]
            assert result.report_dir.parent.parent == Path(request.config.getoption("bench_report_dir")).resolve()

        @pytest.mark.bench_plan(None)
        def test_a_marker_beats_the_command_line(bench_plan):
            assert bench_plan is None

        @pytest.mark.bench_plan("seed-000", seed=3)
        def test_a_marker_seed_beats_the_command_line(bench_plan):
            assert bench_plan.name == "seed-000" and bench_plan.seed == 3
    """, small_agentic))
    reports = tmp_path / "reports"
    outcome = bench_dir.runpytest("--bench-plan", "poison.toml", "--bench-seed", "11", "--bench-report-dir",
                                  str(reports))
    outcome.assert_outcomes(passed=3)
    assert "rollout-bench: plan=poison.toml, seed=11, reports=" in outcome.stdout.str()
    (summary,) = reports.glob("*/ref-gather_fixed/summary.json")
    assert '"seed": 11' in summary.read_text()

    without = bench_dir.runpytest("-k", "command_line and not marker")  # no options: no plan at all
    without.assert_outcomes(failed=1)
    assert "assert None.name" in without.stdout.str() or "AttributeError" in without.stdout.str()


def test_server_fixture_failure_shows_seed_and_fault_log(bench_dir: pytest.Pytester, small_agentic: Path) -> None:
    bench_dir.makepyfile(test_server=_source("""
        import json, pytest, urllib.request

        @pytest.mark.bench_trace(TRACE)
        @pytest.mark.bench_plan("poison.toml", seed=9)
        def test_server(bench_server):
            spec = next(t for t in bench_server.trajectories if t.id == "g00001-2")
            body = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
            request = urllib.request.Request(bench_server.url + "/generate", data=json.dumps(body).encode(),
                                             headers={"X-Bench-Trajectory": spec.id})
            urllib.request.urlopen(request, timeout=30).read()
            assert bench_server.fault_events == []
    """, small_agentic))
    outcome = bench_dir.runpytest()
    outcome.assert_outcomes(failed=1)
    text = outcome.stdout.str()
    assert "plan poison, seed 9, 1 requests, 1 fault events" in text
    assert "fault: raise_after_generate (rule poison-one) on g00001-2 turn 0 attempt 1" in text


def test_assert_no_violations_carries_the_explanation(bench_dir: pytest.Pytester, small_agentic: Path) -> None:
    bench_dir.makepyfile(test_helper=_source("""
        import pytest
        from bench.testing.pytest_plugin import assert_no_violations

        @pytest.mark.bench_trace(TRACE)
        @pytest.mark.bench_plan("poison.toml")
        def test_helper(bench_run):
            fixed = bench_run("ref-gather:fixed", isolation="inline")
            assert_no_violations(fixed)
            with pytest.raises(AssertionError) as raised:
                assert_no_violations(bench_run("ref-gather:unfixed", isolation="inline"))
            message = str(raised.value)
            assert message.startswith("ref-gather:unfixed violated batch_survival")
            assert "seed 5" in message and "repro: " in message and "InjectedFault" in message
    """, small_agentic))
    bench_dir.runpytest().assert_outcomes(passed=1)


PROFILE_TESTS = """
    from pathlib import Path
    from hypothesis import given, settings, strategies as st

    def test_profile():
        print("PROFILE", settings.get_current_profile_name(), settings().derandomize, settings().database)

    @given(st.integers(0, 1000))
    def test_fails_for_large(x):
        assert x < 10
"""


@pytest.mark.parametrize("env, ini, profile, derandomize", [
    ({"ROLLOUT_BENCH_HYPOTHESIS_PROFILE": "nightly"}, "", "rollout-bench-nightly", False),
    ({}, "pr", "rollout-bench-pr", True),
    ({"ROLLOUT_BENCH_HYPOTHESIS_PROFILE": "nightly"}, "pr", "rollout-bench-nightly", False),  # env beats ini
    ({}, "", "ci", True),  # nothing asked: Hypothesis' own CI profile stays
])
def test_hypothesis_profile_is_chosen_explicitly_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path, env: dict[str, str], ini: str,
                                                          profile: str, derandomize: bool) -> None:
    database = tmp_path / "hypothesis-db"
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("ROLLOUT_BENCH_HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("ROLLOUT_BENCH_HYPOTHESIS_DB", str(database))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if ini:
        pytester.makeini(f"[pytest]\nbench_hypothesis_profile = {ini}\n")
    pytester.makepyfile(test_profile=PROFILE_TESTS)
    outcome = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")  # a fresh process: profiles are global
    outcome.assert_outcomes(passed=1, failed=1)
    line = next(line for line in outcome.stdout.lines if "PROFILE " in line).partition("PROFILE ")[2]
    assert line.split()[:2] == [profile, str(derandomize)], line
    if profile == "rollout-bench-nightly":
        assert str(database) in line
        assert any(database.rglob("*")), "the nightly profile kept no failing example"
    else:
        assert not database.exists()


def test_readme_example_is_the_example_test_file() -> None:
    """The README's copyable test file is tests/test_plugin_example.py, which the suite runs."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("A complete test file to copy"):]
    block = section[section.index("```python\n") + len("```python\n"):section.index("\n```", section.index("```python"))]
    source = (root / "tests" / "test_plugin_example.py").read_text(encoding="utf-8")
    body = source[source.index("import json"):]
    assert block.strip() == body.strip()
