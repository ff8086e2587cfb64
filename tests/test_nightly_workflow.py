"""The nightly workflow template: its structure, that what it runs exists, and that its steps work.

The workflow's shell steps read only environment variables (every `${{ }}` expression sits in
an `env:`, `if:` or `with:` block), so this test runs the regression and summary steps
verbatim with bash, on a small trace, and checks exit statuses and artefacts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.cli import build_parser
from bench.targets import resolve_target
from bench.testing.hypothesis_profiles import NIGHTLY, resolve
from bench.trace.shipped import resolve_trace
from faults import resolve_plan
from tests.plans_for_tests import POISON_PLAN

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
BIN = Path(sys.executable).parent
REGRESSION = "Run the regression plans"
@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _default(value: Any) -> str:
    """The literal an `${{ a || b || 'literal' }}` expression falls back to (plain values as they are)."""
    text = str(value)
    expression = re.fullmatch(r"\$\{\{(.*)\}\}", text.strip())
    if expression is None:
        return text
    literal = re.search(r"'([^']*)'\s*$", expression.group(1))
    return literal.group(1) if literal else ""


def _env(workflow: dict[str, Any]) -> dict[str, str]:
    return {key: _default(value) for key, value in workflow["env"].items()}


def _steps(workflow: dict[str, Any], job: str = "regression") -> list[dict[str, Any]]:
    return workflow["jobs"][job]["steps"]  # type: ignore[no-any-return]


def _step(workflow: dict[str, Any], name: str, job: str = "regression") -> dict[str, Any]:
    return next(step for step in _steps(workflow, job) if step.get("name") == name)


def _command_lines(script: str) -> list[str]:
    """Shell lines with backslash continuations joined."""
    return [line.strip() for line in script.replace("\\\n", " ").splitlines() if line.strip()]


def test_workflow_structure(workflow: dict[str, Any]) -> None:
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    (schedule,) = triggers["schedule"]
    assert len(schedule["cron"].split()) == 5
    assert set(triggers["workflow_dispatch"]["inputs"]) == {"target", "plans", "trace", "args"}
    assert workflow["permissions"] == {"contents": "read"}
    assert set(workflow["jobs"]) == {"regression", "sweep"}
    job = workflow["jobs"]["regression"]
    assert job["runs-on"] and 0 < job["timeout-minutes"] <= 90
    steps = _steps(workflow)
    uses = [step["uses"] for step in steps if "uses" in step]
    assert all(re.fullmatch(r"actions/[a-z-]+(/[a-z]+)?@v\d+", u) for u in uses), uses
    python = next(step for step in steps if step.get("uses", "").startswith("actions/setup-python"))
    assert python["with"]["python-version"] == "3.11"
    names = [step.get("name") for step in steps]
    regression = names.index(REGRESSION)
    uploads = [i for i, step in enumerate(steps) if step.get("uses", "").startswith("actions/upload-artifact")]
    assert len(uploads) == 2 and all(i > regression for i in uploads)
    for i in uploads:  # artefacts are kept when the regression step fails (it fails on violations)
        assert "!cancelled()" in steps[i]["if"] or "always()" in steps[i]["if"]
    env = _env(workflow)
    paths = {steps[i]["with"]["path"].rstrip("/") for i in uploads}
    assert paths == {"reports", env["ROLLOUT_BENCH_HYPOTHESIS_DB"]}
    cached = [step["with"]["path"] for step in steps if step.get("uses", "").startswith("actions/cache/")]
    assert cached == [env["ROLLOUT_BENCH_HYPOTHESIS_DB"]] * 2  # restored before, saved after
    assert resolve(env["ROLLOUT_BENCH_HYPOTHESIS_PROFILE"]) == NIGHTLY
    for step in steps:  # inputs reach scripts through env only: testable here, and no script injection
        assert "${{" not in step.get("run", ""), step.get("name")


CONTROL = {";", "||", "&&", "|", "{", "}", ">>", ">", "(", ")"}
PYTEST_VALUE_OPTIONS = {"-p", "--bench-report-dir", "--junitxml"}


def _commands(line: str, values: dict[str, str]) -> list[list[str]]:
    """The simple commands of one shell line, variables replaced by `values`, split at control operators."""
    expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), line)
    lexer = shlex.shlex(expanded, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in CONTROL:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def test_every_command_the_workflow_runs_exists(workflow: dict[str, Any], pytestconfig: pytest.Config) -> None:
    env = _env(workflow)
    plans = env["BENCH_PLANS"].split()
    values = {**env, "plan": plans[0], "name": plans[0], "folder": "reports/x/", "code": "0", "status": "0",
              "GITHUB_STEP_SUMMARY": "summary.md"}
    parser, used = build_parser(), set()
    scripts = [step["run"] for step in _steps(workflow) if "run" in step]
    for line in (line for script in scripts for line in _command_lines(script)):
        for words in _commands(line, values):
            if words[0] == "rollout-bench":
                argv = words[1:]
                if argv == ["--version"]:
                    used.add("--version")
                    continue
                try:
                    parser.parse_args(argv)
                except SystemExit as error:
                    pytest.fail(f"workflow line {line!r}: `rollout-bench {' '.join(argv)}` does not parse ({error})")
                used.add(argv[0])
            elif words[:3] == ["python", "-m", "pytest"]:
                args = words[3:]
                for index, word in enumerate(args):
                    if word.startswith("--bench-"):
                        pytestconfig.getoption(word[2:].replace("-", "_"))  # ValueError if the plugin lacks it
                    elif not word.startswith("-") and (index == 0 or args[index - 1] not in PYTEST_VALUE_OPTIONS):
                        assert (ROOT / word).exists(), f"pytest path {word} in the workflow does not exist"
                used.add("pytest")
    assert used == {"--version", "run", "report", "pytest"}
    for command in sorted(used - {"pytest", "--version"}):  # the console script itself, as CI calls it
        shown = subprocess.run([str(BIN / "rollout-bench"), command, "--help"], capture_output=True, text=True,
                               timeout=120)
        assert shown.returncode == 0 and f"usage: rollout-bench {command}" in shown.stdout, shown.stderr


def test_every_plan_target_trace_and_install_spec_it_names_exists(workflow: dict[str, Any]) -> None:
    env = _env(workflow)
    plans = env["BENCH_PLANS"].split()
    assert plans and all(resolve_plan(plan).rules for plan in plans)
    assert resolve_target(env["BENCH_TARGET"]).name == env["BENCH_TARGET"]
    assert resolve_trace(env["BENCH_TRACE"]).is_file()
    install = shlex.split(env["BENCH_INSTALL"])
    assert install[0] == "-c" and (ROOT / install[1]).is_file()
    assert install[2] == ".[test]" and "test = [" in (ROOT / "pyproject.toml").read_text()


def _run_step(workflow: dict[str, Any], name: str, cwd: Path, job: str = "regression",
              **overrides: str) -> subprocess.CompletedProcess[str]:
    job_env = {key: _default(value) for key, value in workflow["jobs"][job].get("env", {}).items()}
    env = {**os.environ, **_env(workflow), **job_env, **overrides,
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = "set -eo pipefail\n" + _step(workflow, name, job)["run"]  # GitHub's bash: -e and pipefail
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_regression_step_runs_every_plan_fails_on_violations_and_keeps_reports(
        workflow: dict[str, Any], small_agentic: Path, tmp_path: Path) -> None:
    (tmp_path / "poison.toml").write_text(POISON_PLAN, encoding="utf-8")
    small = {"BENCH_TRACE": str(small_agentic), "BENCH_ARGS": "--time-scale 0 --watchdog 30"}

    (tmp_path / "pass").mkdir()
    passing = _run_step(workflow, REGRESSION, tmp_path / "pass", BENCH_TARGET="ref-gather:fixed",
                        BENCH_PLANS=str(tmp_path / "poison.toml"), **small)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    reports = tmp_path / "pass" / "reports"
    assert json.loads((reports / "poison" / "summary.json").read_text())["violations"] == []
    assert ET.parse(reports / "junit" / "poison.xml").getroot().get("failures") == "0"

    (tmp_path / "fail").mkdir()
    failing = _run_step(workflow, REGRESSION, tmp_path / "fail", BENCH_TARGET="ref-gather:unfixed",
                        BENCH_PLANS=f"{tmp_path / 'poison.toml'} no-such-plan", **small)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    reports = tmp_path / "fail" / "reports"
    status = (reports / "status.txt").read_text().splitlines()
    assert status == [f"{tmp_path / 'poison.toml'}: exit 1", "no-such-plan: exit 2"]  # every plan ran
    failed = [case.get("name") for case in ET.parse(reports / "junit" / "poison.xml").getroot().iter("testcase")
              if case.find("failure") is not None]
    assert failed == ["batch_survival"] and (reports / "poison" / "repro.toml").is_file()

    summary_file = tmp_path / "summary.md"
    summaries = _run_step(workflow, "Summaries", tmp_path / "fail", GITHUB_STEP_SUMMARY=str(summary_file))
    assert summaries.returncode == 0, summaries.stderr
    text = summary_file.read_text()
    assert text.startswith("```") and "ref-gather:unfixed" in text and "poison / 5" in text


SWEEP_STEP = "Run this shard of the sweep"


def test_the_sweep_job_is_off_by_default_and_its_shards_cover_the_grid_once(
        workflow: dict[str, Any], small_agentic: Path, tmp_path: Path) -> None:
    job = workflow["jobs"]["sweep"]
    assert "vars.BENCH_SWEEP_RATES != ''" in job["if"]  # costs nothing until a repository asks for it
    shards = job["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, int(job["env"]["BENCH_SWEEP_SHARDS"]) + 1))  # the matrix and its count agree
    assert job["strategy"]["fail-fast"] is False
    for step in job["steps"]:
        assert "${{" not in step.get("run", ""), step.get("name")
    [upload] = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert "!cancelled()" in upload["if"] and upload["with"]["path"].rstrip("/") == "sweep"
    small = {"BENCH_TRACE": str(small_agentic), "BENCH_PLANS": "seed-000", "BENCH_TARGET": "ref-gather:fixed",
             "BENCH_SWEEP_RATES": "0.1,0.2", "BENCH_SWEEP_SEEDS": "1", "BENCH_SWEEP_SHARDS": "2",
             "BENCH_SWEEP_ARGS": "--time-scale 0 --jobs 2"}
    runs = []
    for shard in ("1", "2"):
        done = _run_step(workflow, SWEEP_STEP, tmp_path, job="sweep", BENCH_SWEEP_SHARD=shard, **small)
        assert done.returncode == 0, done.stdout + done.stderr
        table = (tmp_path / "sweep" / f"shard-{shard}" / "sweep.csv").read_text().splitlines()[1:]
        runs += [line.split(",", 1)[0] for line in table]
        summary = json.loads((tmp_path / "sweep" / f"shard-{shard}" / "sweep.json").read_text())
        assert summary["shard"] == f"{shard}/2" and summary["status"] == "finished"
    assert sorted(runs) == ["000-seed-000-ref-gather_fixed-r0.1-s1", "001-seed-000-ref-gather_fixed-r0.2-s1"]
    summary_file = tmp_path / "summary.md"
    shown = _run_step(workflow, "Summary", tmp_path, job="sweep", BENCH_SWEEP_SHARD="1",
                      GITHUB_STEP_SUMMARY=str(summary_file))
    assert shown.returncode == 0 and "seed-000 ref-gather:fixed" in summary_file.read_text(), shown.stderr
