"""`rollout-bench serve` as a user runs it: prints its URL, answers, stops cleanly on a signal."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.server_helpers import request


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_url_and_stops_on_signal(tmp_path: Path, signum: int) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"at (http://127\.0\.0\.1:\d+) \(SGLang 0\.5\.15\.post1", line)
        assert match, line
        url = match.group(1)
        assert request(url, "/health").status == 200
        assert request(url, "/generate", {"text": "hello"}).status == 200
        process.send_signal(signum)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "stopped after 2 requests" in out
    log = pd.read_csv(tmp_path / "requests.csv")
    assert list(log["endpoint"]) == ["/health", "/generate"] and list(log["status"]) == [200, 200]
    assert log["drift"].tolist()[1] == "unknown_prompt"


def test_serve_rejects_a_bad_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header"}\n')
    run = subprocess.run([sys.executable, "-m", "bench", "serve", "--trace", str(bad), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"{bad}:1: schema_version" in run.stderr
