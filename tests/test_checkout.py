"""Frameworks run from a checkout: `--source DIR` names it, the report says which commit it judged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report.summary import framework_line
from bench.targets import TargetError, resolve_target
from bench.targets.frameworks.checkout import UNKNOWN, CheckoutError, named_source, read_checkout
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.slime.target import MARKER, PATH_ENV
from bench.targets.reference.gather import RefGather

INSTANCE = RefGather("fixed")  # a plug-in given as an adapter instance
SLIME_PATH = os.environ.get(PATH_ENV)
SLIME_PYTHON = target_python("slime")


def _git(folder: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _repo(folder: Path) -> str:
    (folder / "fw").mkdir(parents=True)
    (folder / "fw" / "core.py").write_text("x = 1\n")
    _git(folder, "init", "-q")
    _git(folder, "add", ".")
    _git(folder, "commit", "-qm", "one")
    return _git(folder, "rev-parse", "HEAD")


def test_a_git_checkout_is_named_by_its_commit_and_uncommitted_changes_are_said(tmp_path: Path) -> None:
    head = _repo(tmp_path)
    found = read_checkout("fw", tmp_path, "fw/core.py")
    assert found.commit == head and found.dirty is False
    assert found.info() == {"framework": "fw", "source": str(tmp_path.resolve()), "commit": head}
    (tmp_path / "fw" / "core.py").write_text("x = 2\n")
    assert read_checkout("fw", tmp_path, "fw/core.py").info()["commit"] == f"{head} (with uncommitted changes)"


def test_a_copy_without_git_runs_with_its_commit_unknown_even_inside_another_repository(tmp_path: Path) -> None:
    _repo(tmp_path)
    inner = tmp_path / "copy"
    shutil.copytree(tmp_path / "fw", inner / "fw")  # inside the repository above, but not its top
    assert read_checkout("fw", inner, "fw/core.py").commit == UNKNOWN


def test_a_wrong_checkout_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckoutError, match="no such folder"):
        read_checkout("slime", tmp_path / "nowhere", MARKER)
    with pytest.raises(CheckoutError, match=r"no slime/rollout/sglang_rollout\.py there \(is it a slime checkout\?\)"):
        read_checkout("slime", tmp_path, MARKER)


def test_the_source_option_wins_over_its_older_name_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_PATH", "/from/env")
    assert named_source({"source": "/a", "slime_path": "/b"}, "FW_PATH", "slime_path") == "/a"
    assert named_source({"slime_path": "/b"}, "FW_PATH", "slime_path") == "/b"
    assert named_source({}, "FW_PATH", "slime_path") == "/from/env"


def test_the_report_line_names_a_checkout_or_a_version() -> None:
    assert framework_line({"framework": "slime", "source": "/s", "commit": "abc"}) == "slime @ abc (/s)"
    assert framework_line({"framework": "verifiers", "version": "0.1.14", "openai": "2.36.0"}) == \
        "verifiers 0.1.14 (openai 2.36.0)"


def test_a_plug_in_variant_is_handed_to_its_class() -> None:
    assert resolve_target("bench.targets.reference.gather:RefGather:fixed").name == "ref-gather:fixed"
    with pytest.raises(TargetError, match=r"RefGather\('nope'\): ref-gather has variants unfixed and fixed"):
        resolve_target("bench.targets.reference.gather:RefGather:nope")
    with pytest.raises(TargetError, match="a variant needs a class or factory"):
        resolve_target(f"{__name__}:INSTANCE:fixed")
    assert resolve_target(f"{__name__}:INSTANCE") is INSTANCE


def test_slime_path_and_source_cannot_disagree(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "slime", "--source", "/a",
                          "--slime-path", "/b", "--out", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2 and "--slime-path is --source's older name: give one of them" in run.stderr


@pytest.mark.skipif(SLIME_PATH is None or SLIME_PYTHON is None,
                    reason=f"needs a slime checkout ({PATH_ENV}) and its environment (make slime-env)")
def test_real_slime_from_a_git_checkout_reports_its_commit(tmp_path: Path) -> None:
    checkout = tmp_path / "slime-checkout"
    shutil.copytree(Path(SLIME_PATH) / "slime", checkout / "slime", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "fw").mkdir()
    _git(checkout, "init", "-q")
    _git(checkout, "add", ".")
    _git(checkout, "commit", "-qm", "slime")
    head = _git(checkout, "rev-parse", "HEAD")
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "slime", "--source", str(checkout),
                          "--trace", "rlvr-500", "--n", "4", "--fault", "latency:ms=1,p=1", "--repro-reruns", "0",
                          "--out", str(out)], capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != PATH_ENV})
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["framework"] == {"framework": "slime", "source": str(checkout.resolve()), "commit": head}
    assert f"framework        slime @ {head} ({checkout.resolve()})" in run.stdout
