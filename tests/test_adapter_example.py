"""The README's adapter guide: its example is the file the suite runs, and it does what the guide says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "echo_adapter.py"


def test_the_guide_shows_the_whole_example_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Write an adapter"):]
    block = section[section.index("```python\n") + len("```python\n"):section.index("\n```", section.index("```python"))]
    source = EXAMPLE.read_text(encoding="utf-8")
    assert block.strip() == source.strip()
    assert len(source.splitlines()) < 80


@pytest.mark.parametrize("variant", ["unfixed", "fixed"])
def test_the_example_fails_unfixed_and_passes_fixed_as_the_guide_says(tmp_path: Path, variant: str) -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--target", f"echo_adapter:EchoRollout:{variant}",
                          "--trace", "rlvr-500", "--n", "40", "--fault", "missing_logprobs:p=0.25",
                          "--target-option", "reward=0.5", "--repro-reruns", "0", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=EXAMPLE.parent, timeout=300)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target"] == f"echo:{variant}" and summary["framework"]["framework"] == "aiohttp"
    hit = summary["drop_rate_by_fault"]["missing_logprobs"]["trajectories"]
    assert hit == 15
    if variant == "unfixed":
        assert run.returncode == 1, run.stdout + run.stderr
        by_invariant: dict[str, int] = {}
        for violation in summary["violations"]:
            by_invariant[violation["invariant"]] = by_invariant.get(violation["invariant"], 0) + 1
        assert by_invariant == {"token_alignment": hit, "provenance": hit}
    else:
        assert run.returncode == 0, run.stdout + run.stderr
        assert summary["violations"] == [] and summary["outcomes"]["failed"] == hit
