"""`make soak`'s driver in --quick mode (20 s, 40 trajectories): it drives the server through several cycles, samples
memory and descriptors, and each of its checks measures what it names. The 30-minute soak itself is `make soak`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.soak import _verdict

ROOT = Path(__file__).resolve().parent.parent


def test_quick_soak_passes_every_check_and_reports_them(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    assert result["cycles"] >= 2 and result["requests"] >= 2 * result["requests_per_cycle"]
    assert set(result["checks"]) == {"rss_growth_after_warmup", "fd_growth_after_warmup", "determinism_first_cycle",
                                     "no_unexplained_5xx", "healthy_at_end", "log_row_per_request", "whole_log_on_disk"}
    # the quick mode keeps 1,000 requests in memory: the server's log spilled to disk and was read back whole
    assert result["requests"] > 1_000 and (tmp_path / "server-logs" / "requests.csv").exists()
    assert all(check["ok"] for check in result["checks"].values())
    assert "events at concurrency 32" in result["checks"]["determinism_first_cycle"]["value"]
    assert not result["checks"]["determinism_first_cycle"]["value"].startswith("0 events")  # the plan fired
    assert len(result["samples"]) >= 4 and all(s["rss_mb"] > 0 and s["fds"] > 0 for s in result["samples"])
    assert (tmp_path / "soak.png").stat().st_size > 10_000 and (tmp_path / "soak.csv").exists()


def _args() -> argparse.Namespace:
    return argparse.Namespace(minutes=1.0, trace="t", plan="p", seed=1, concurrency=32, keep_requests=10)


def _samples(rss: list[float], fds: list[int]) -> list[dict]:
    return [{"t_s": 10.0 * i, "requests": 100 * i, "rss_mb": r, "fds": f} for i, (r, f) in enumerate(zip(rss, fds))]


def test_each_check_fails_on_what_it_watches() -> None:
    events = [("r", "abort", "g0-0", 0, 1)]
    on_disk = {"requests_csv_rows": 3, "spill_left": False}
    good = _verdict(_args(), _samples([100, 100, 105], [20, 20, 21]), _tally(3), 2, 1, 5.0, True,
                    [{"status": 200, "seq": i} for i in range(3)], events, events, on_disk)["checks"]
    assert all(check["ok"] for check in good.values())
    bad = _verdict(_args(), _samples([100, 100, 120], [20, 20, 40]), _tally(4), 2, 1, 5.0, False,
                   [{"status": 500, "error": "KeyError: x", "seq": i} for i in range(3)], events, events[:0],
                   {"requests_csv_rows": 2, "spill_left": True})["checks"]
    assert not any(check["ok"] for check in bad.values())


def _tally(requests: int):  # type: ignore[no-untyped-def]
    from benchmarks.soak import Tally

    return Tally(requests=requests)
