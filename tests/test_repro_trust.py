"""A repro file from someone else's CI names code: a target module, maybe an interpreter. `run --repro` says what it
will run, and runs code from outside the current project and the bench only with `--trust-plugin` (built-in targets
and the project's own modules need nothing). The refused module is never imported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.orchestration.trust import UntrustedRepro, check_repro, python_provenance, target_provenance

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = '''
from pathlib import Path
Path(__file__).with_name("imported.marker").write_text("imported")
from bench.targets.reference.gather import RefGather
Target = RefGather
'''


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run's run.toml (a repro of the whole run), for a built-in target."""
    out = tmp_path_factory.mktemp("run") / "report"
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--target", "ref-gather:fixed", "--n", "8",
                           "--plan", "none", "--time-scale", "0", "--in-process", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "run.toml"


def _repro_naming(whole_run: Path, folder: Path, target: str) -> Path:
    text = whole_run.read_text(encoding="utf-8")
    edited, count = re.subn(r'(?m)^target = .*$', f'target = "{target}"', text)
    assert count == 1
    path = folder / "repro.toml"
    path.write_text(edited, encoding="utf-8")
    return path


def _rerun(repro: Path, cwd: Path, plugin_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(repro), "--out", str(cwd / "out"),
                           "--repro-reruns", "0", *extra], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_module_from_elsewhere_is_named_and_refused_unimported(whole_run: Path, tmp_path: Path) -> None:
    elsewhere, project = tmp_path / "artifact_code", tmp_path / "project"
    elsewhere.mkdir(), project.mkdir()
    (elsewhere / "someone_elses_target.py").write_text(PLUGIN, encoding="utf-8")
    repro = _repro_naming(whole_run, project, "someone_elses_target:Target")
    refused = _rerun(repro, project, elsewhere)
    assert refused.returncode == 2
    assert "someone_elses_target" in refused.stderr and str(elsewhere.resolve()) in refused.stderr
    assert "--trust-plugin" in refused.stderr
    assert not (elsewhere / "imported.marker").exists()  # named, never imported
    trusted = _rerun(repro, project, elsewhere, "--trust-plugin")
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert "repro runs target someone_elses_target:Target: module someone_elses_target from" in trusted.stdout
    assert "(outside the current project)" in trusted.stdout
    assert (elsewhere / "imported.marker").exists()


def test_the_projects_own_module_runs_without_asking(whole_run: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_target.py").write_text(PLUGIN, encoding="utf-8")
    done = _rerun(_repro_naming(whole_run, project, "my_target:Target"), project, project)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(the current project)" in done.stdout and (project / "imported.marker").exists()


def test_a_plug_in_in_the_working_directory_runs_and_reruns_from_the_command_line_script(tmp_path: Path) -> None:
    """`rollout-bench` (the script, whose path lacks the working directory, unlike `python -m bench`) run from a
    plug-in's own folder: the run, its repro and an in-process run all find the module there, as a worker does."""
    script = Path(sys.executable).with_name("rollout-bench")
    if not script.exists():
        pytest.skip(f"no rollout-bench script beside {sys.executable}")
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_target.py").write_text(PLUGIN, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)

    first = command("run", "--target", "my_target:Target:fixed", "--n", "4", "--plan", "none", "--time-scale", "0",
                    "--out", "first")
    assert first.returncode == 0, first.stderr[-2000:]
    rerun = command("run", "--repro", "first/run.toml", "--out", "again", "--repro-reruns", "0")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"module my_target from {(project / 'my_target.py').resolve()} (the current project)" in rerun.stdout
    inline = command("run", "--target", "my_target:Target:fixed", "--n", "4", "--plan", "none", "--time-scale", "0",
                     "--in-process", "--out", "inline")
    assert inline.returncode == 0, inline.stderr[-2000:]


def test_a_built_in_target_runs_without_asking(whole_run: Path, tmp_path: Path) -> None:
    done = _rerun(whole_run, tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "repro runs target ref-gather:fixed (built in)" in done.stdout


def test_an_interpreter_the_bench_did_not_build_needs_trust(tmp_path: Path) -> None:
    assert python_provenance(sys.executable).trusted  # type: ignore[union-attr]
    stranger = tmp_path / "bin" / "python"
    assert not python_provenance(str(stranger)).trusted  # type: ignore[union-attr]
    with pytest.raises(UntrustedRepro, match=re.escape(str(stranger))):
        check_repro("ref-gather:fixed", str(stranger), trust=False)
    assert check_repro("ref-gather:fixed", str(stranger), trust=True)[1].startswith(f"repro runs interpreter {stranger}")


def test_an_unknown_module_is_not_trusted() -> None:
    found = target_provenance("no_such_module_anywhere:Target")
    assert not found.trusted and "not found" in found.what


def test_an_interpreter_path_climbing_out_of_the_bench_environments_is_not_trusted(tmp_path: Path) -> None:
    from bench.targets.frameworks.envs import targets_dir

    climbing = targets_dir() / ".." / ".." / ".." / str(tmp_path).lstrip("/") / "bin" / "python"
    assert not python_provenance(str(climbing)).trusted  # type: ignore[union-attr]
