"""`rollout-bench serve` as a user runs it: prints its URL, answers, stops cleanly on a signal."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
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


def test_serve_plays_the_sglang_build_it_is_given() -> None:
    """`--sglang-build sglang-miles`: the build miles runs, whose `/flush_cache` goes through after a retract pause
    with a request in flight (upstream's refuses it: tests/test_server_admin.py)."""
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                "--time-scale", "10", "--sglang-build", "sglang-miles"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"at (http://[\d.:]+) \(SGLang 0\.5\.15\.post1, sglang-miles build,", line)
        assert match, line
        url = match.group(1)
        replies: list[object] = []
        worker = threading.Thread(target=lambda: replies.append(request(url, "/generate", {"text": "hello"})))
        worker.start()
        deadline = time.monotonic() + 10
        while request(url, "/get_load").json()[0]["num_reqs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        request(url, "/pause_generation", {"mode": "retract"})
        assert request(url, "/get_load").json()[0]["num_reqs"] == 1  # still there, retracted
        assert request(url, "/flush_cache").status == 200
        request(url, "/continue_generation", {})
        request(url, "/abort_request", {"abort_all": True})
        worker.join(10)
        assert replies
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0


def test_serve_rejects_a_bad_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header"}\n')
    run = subprocess.run([sys.executable, "-m", "bench", "serve", "--trace", str(bad), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"{bad}:1: schema_version" in run.stderr


def test_serve_with_a_plan_and_faults_writes_the_fault_log(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                "--plan", "seed-001", "--fault", "http_error:status=503,turns=0", "--seed", "11",
                                "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://[\d.:]+) ", process.stdout.readline()).group(1)  # type: ignore[union-attr]
        assert process.stdout.readline().strip() == "fault plan 'seed-001': 2 rules, seed 11"  # type: ignore[union-attr]
        assert request(url, "/generate", {"text": "hello"}).status == 503
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, err
    faults = pd.read_csv(tmp_path / "faults.csv")
    assert f"stopped after 1 requests, {len(faults)} fault events" in out
    assert "http_error" in set(faults["fault"]) and set(faults["turn"]) == {0}
    assert ("rules that never fired: stale-policy" in out) == ("stale_weight_version" not in set(faults["fault"]))


def test_serve_rejects_an_unknown_fault() -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "serve", "--fault", "nope", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown fault 'nope'; valid faults: abort" in run.stderr


def test_a_second_server_on_the_same_log_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    """Two servers on one --log-dir would overwrite each other's spilled chunks and final CSVs."""
    first = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                              "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "http://127.0.0.1:" in first.stdout.readline()  # type: ignore[union-attr]
        second = subprocess.run([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                 "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"--log-dir {tmp_path}: another server writes its logs there (pid {first.pid})" in second.stderr
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    finally:
        first.kill()
    assert first.returncode == 0
    assert (tmp_path / "requests.csv").exists() and not (tmp_path / "spill").exists()  # written, claim let go
    again = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                              "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the folder is free again once the first server stopped
        assert "http://127.0.0.1:" in again.stdout.readline()  # type: ignore[union-attr]
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=30)
    finally:
        again.kill()
    assert again.returncode == 0
