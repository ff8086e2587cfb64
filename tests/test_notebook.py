"""notebooks/drop_rates.ipynb runs end to end on a fresh sweep and draws its figures; it is committed clean."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "drop_rates.ipynb"
FIGURES = 5  # outcome/drop rate by fault, retries, throughput + latency, drop rate vs rate, metrics vs rate


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chaos plan (every fault type) x both ref-gather variants x two rates, 60 trajectories each:
    every section of the notebook has data, in four runs."""
    out = tmp_path_factory.mktemp("notebook") / "sweep"
    done = subprocess.run([sys.executable, "-m", "bench", "sweep", "--plan", "chaos", "--target",
                           "ref-gather:unfixed,ref-gather:fixed", "--rates", "0.02,0.1", "--seeds", "1", "--n", "60",
                           "--time-scale", "0", "--jobs", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: the unfixed variant's violations
    return out


def _kernel(tmp_path: Path) -> KernelManager:
    """A kernel on this very interpreter (its venv has the bench), whatever kernels the machine has."""
    spec = tmp_path / "kernels" / "rollout-bench-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rollout-bench tests", "language": "python"}), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="rollout-bench-test", kernel_spec_manager=specs, transport="ipc",
                         ip=str(tmp_path / "kernel-ipc"))


def _execute(tmp_path: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    kernel = _kernel(tmp_path)
    client = NotebookClient(notebook, km=kernel, timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell errors
    finally:  # nbclient leaves a kernel it was handed running: the suite would leave one process per test behind
        if kernel.has_kernel:
            kernel.shutdown_kernel(now=True)
    return notebook


def _outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]


def test_notebook_is_committed_clean() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert sum(cell.cell_type == "markdown" for cell in notebook.cells) >= len(code) // 2  # prose, not just code
    assert "from bench import" in code[0].source and "load_report(SWEEP)" in code[0].source  # the public API


def test_notebook_runs_end_to_end_on_fresh_sweep_data(small_sweep: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_BENCH_SWEEP", str(small_sweep))
    monkeypatch.delenv("ROLLOUT_BENCH_RUN", raising=False)
    notebook = _execute(tmp_path)
    outputs = _outputs(notebook)
    assert [o for o in outputs if o["output_type"] == "error"] == []
    images = [base64.b64decode(o["data"]["image/png"]) for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == FIGURES
    assert all(image.startswith(b"\x89PNG") and len(image) > 10_000 for image in images)
    printed = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert f"sweep: {small_sweep.resolve()} (4 runs)" in printed
    assert "run:   " + str((small_sweep / "runs").resolve()) in printed  # defaulted to one of the sweep's runs
    assert "retry amplification:" in printed
    assert "not checked: {" in printed  # the provenance section ran on the run's verdicts
    tables = "".join(o["data"].get("text/html", "") for o in outputs if "data" in o)
    assert "mismatch_rate" in tables


def test_notebook_reads_the_run_named_by_the_environment(small_sweep: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    [chosen] = sorted((small_sweep / "runs").glob("*-chaos-ref-gather_unfixed-r0.1-s1"))
    monkeypatch.setenv("ROLLOUT_BENCH_SWEEP", str(small_sweep))
    monkeypatch.setenv("ROLLOUT_BENCH_RUN", str(chosen))
    printed = "".join(o.get("text", "") for o in _outputs(_execute(tmp_path)) if o["output_type"] == "stream")
    assert f"run:   {chosen.resolve()}" in printed
    assert "ref-gather:unfixed" in printed and "chaos / 1" in printed  # the summary of that run, not another


def test_notebook_analyses_a_single_run_without_a_sweep(small_sweep: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`ROLLOUT_BENCH_RUN` alone: the run's sections draw their figures, the sweep's say there is no sweep."""
    [chosen] = sorted((small_sweep / "runs").glob("*-chaos-ref-gather_unfixed-r0.1-s1"))
    monkeypatch.delenv("ROLLOUT_BENCH_SWEEP", raising=False)
    monkeypatch.setenv("ROLLOUT_BENCH_RUN", str(chosen))
    monkeypatch.chdir(tmp_path)  # no reports/sweep-demo to fall back on
    outputs = _outputs(_execute(tmp_path))
    assert [o for o in outputs if o["output_type"] == "error"] == []
    printed = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert "sweep: none (ROLLOUT_BENCH_RUN alone)" in printed and f"run:   {chosen.resolve()}" in printed
    assert printed.count("no sweep loaded: this section needs ROLLOUT_BENCH_SWEEP") == 4
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3  # the run's: outcomes and drop rate by fault, retries, throughput and latency
