"""A plan file (or `--fault` spec) that cannot mean anything fails with a message naming the file, line, rule
and key, never a traceback: wrong shapes (`rules = 5`, `rules = ["a"]`), infinite or NaN numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faults import PlanError, load_plan, plan_from_specs

RULE = '[[rules]]\nname = "r"\nfault = "latency"\nms = 5\np = "1/2"\n'


@pytest.mark.parametrize("text, where", [
    ('seed = 1\nrules = 5\n', r":2: rules must be an array of tables"),
    ('seed = 1\nrules = ["a"]\n', r":2: rule 0: a rule is a table"),
    ('seed = 1\nrules = [5]\n', r":2: rule 0: a rule is a table"),
    ('name = 5\n' + RULE, r":1: name must be a string"),
    ('description = [1]\n' + RULE, r":1: description must be a string"),
    ('[[rules]]\nfault = "latency"\nms = 5\np = inf\n', r":4: rule 0: p: must be a finite number; got inf"),
    ('[[rules]]\nfault = "latency"\nms = 5\np = nan\n', r":4: rule 0: p: must be a finite number; got nan"),
    ('[[rules]]\nfault = "http_error"\nstatus = inf\np = 0.5\n', r":3: rule 0: status: must be a finite number"),
    ('[[rules]]\nfault = "latency"\nms = nan\np = 0.5\n', r":3: rule 0: ms: must be a finite number; got nan"),
    ('[[rules]]\nfault = "latency"\nms = 1e999\n', r":3: rule 0: ms: must be a finite number; got inf"),
    (RULE + '\n[[rules]]\nfault = "latency"\nms = 1\nwindow = [0, inf]\n',
     r":10: rule 1: window: must be a finite number"),
    ('[[rules]]\nfault = "latency"\nname = 3\nms = 1\n', r":3: rule 0: name: a rule's name is a non-empty string"),
    ('[[rules]]\nfault = "latency"\nms = {a = 1}\n', r":3: rule 0: ms: a table is not a rule value"),
])
def test_a_bad_plan_names_the_file_line_rule_and_key(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PlanError, match=rf"^{path}{where}"):
        load_plan(path)


@pytest.mark.parametrize("spec, key", [("latency:ms=nan", "ms"), ("latency:ms=inf,p=0.5", "ms"),
                                       ("latency:ms=1,window=0-inf", "window"),
                                       ("http_error:status=inf", "status"), ("latency:ms=1,p=nan", "p")])
def test_a_fault_spec_with_a_non_finite_number_is_refused(spec: str, key: str) -> None:
    with pytest.raises(PlanError, match=rf"--fault '{spec}': .*{key}"):
        plan_from_specs([spec], 0)


def test_the_command_line_says_which_plan_and_key_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "inf.toml"
    path.write_text('seed = 1\n[[rules]]\nfault = "http_error"\nstatus = inf\np = 0.5\n')
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--plan", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:4: rule 0: status: must be a finite number" in done.stderr
    assert not (tmp_path / "out").exists()


def test_good_plans_still_load() -> None:
    from faults import resolve_plan, shipped_plans

    for name in shipped_plans():
        assert resolve_plan(name).rules
