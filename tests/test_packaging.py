"""An installed wheel carries its data: shipped traces, the tokenizer and known findings, found without a
checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--disable-pip-version-check", "-w", str(out), str(ROOT)], check=True)
    (built,) = out.glob("rollout_bench-*.whl")
    return built


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_loads_shipped_data(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check",
                    str(wheel)], check=True)
    # Dependencies come from this environment, after the fresh venv's own site-packages, so
    # `bench` can only be the wheel's copy (a .pth line adds a path but runs no editable hook).
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "deps-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import bench, bench.trace.shipped as p\n"
        "from bench.trace import open_trace\n"
        "from bench.tokenizer import load_tokenizer, tokenizer_path\n"
        "print(bench.__file__); print(p.traces_dir())\n"
        "with open_trace(p.shipped_trace('rlvr-500')) as r: n = sum(1 for _ in r)\n"
        "t = load_tokenizer(); print(n, t.decode(t.encode('ok<|im_end|>')), tokenizer_path().is_dir())\n"
        "from bench.orchestration.known import resolve_known\n"
        "path, findings = resolve_known('miles'); print(path, [f.invariant for f in findings])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(python), "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True, env=env)
    module, traces, last, known = run.stdout.splitlines()
    assert module.startswith(str(site)) and traces == str(site / "bench" / "_shipped" / "traces")
    assert last == "500 ok<|im_end|> True"
    shipped = site / "bench" / "targets" / "frameworks" / "miles" / "known_findings.toml"
    assert known == f"{shipped} ['context_budget', 'provenance']"
    cli = subprocess.run([str(target / "bin" / "rollout-bench"), "validate", "agentic-500"], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert cli.returncode == 0 and "agentic-500: valid" in cli.stderr
