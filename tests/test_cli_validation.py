"""Every argument and output path of `run` is checked before anything starts: exit 2 within 2 s, naming
the argument (not a run that ends in "error: outcome", a hang blamed on the target, or a report that cannot
be written once the run is over). Also: `report` refuses a truncated table, and a sweep whose target never
called the server does not pass."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.sweep.table import Finished, outcome_of

# short and fast if a bad value slipped through: the test then fails on its exit status, not by hanging
BASE = [sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "4", "--time-scale", "0",
        "--repro-reruns", "0", "--watchdog", "3"]


FIXED = ["--target", "ref-gather:fixed", "--plan", "none"]  # a run that passes
# issue 19 asks for exit 2 in under 2 s; measured 0.2-0.4 s on an idle machine. A loaded 2-core CI machine starts a
# Python process slower, so the bound here is wider; a run that had started would take far longer than this.
STARTS_WITHIN_S = 5.0


def _run(args: list[str], out: Path, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess[str], float]:
    command = BASE + args
    if "--out" not in args:
        command += ["--out", str(out)]
    clock = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - clock


@pytest.mark.parametrize("args, named", [
    (["--n", "0"], "--n"),
    (["--n", "-5"], "--n"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "-1"], "--concurrency"),
    (["--watchdog", "0"], "--watchdog"),
    (["--watchdog", "nan"], "--watchdog"),
    (["--deadline", "inf"], "--deadline"),
    (["--time-scale", "-1"], "--time-scale"),
    (["--max-drift-share", "2"], "--max-drift-share"),
    (["--repro-reruns", "-1"], "--repro-reruns"),
    (["--invariants", "foo"], "--invariants"),
    (["--invariants", "liveness,foo"], "--invariants"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_a_bad_number_or_name_fails_at_once_naming_the_argument(tmp_path: Path, args: list[str], named: str) -> None:
    done, took = _run(args, tmp_path / "out")
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr
    assert took < STARTS_WITHIN_S, f"took {took:.2f} s"
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_an_out_that_is_a_file_or_an_unwritable_junit_fails_before_the_run(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    cases = [(["--out", str(a_file)], "--out"),
             (["--junit", str(a_file / "junit.xml")], "--junit"),  # its folder would be a file
             (["--junit", str(tmp_path)], "--junit"),  # a folder, not a file
             (["--junit", "/proc/rollout-bench-junit.xml"], "--junit")]  # /proc takes no new files, even as root
    for args, named in cases:
        done, took = _run(args, tmp_path / "out")
        assert done.returncode == 2, (args, done.stdout + done.stderr)
        assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert took < STARTS_WITHIN_S, f"{args}: took {took:.2f} s"
    assert a_file.read_text() == "not a folder\n" and not (tmp_path / "out").exists()


def test_a_junit_in_a_folder_not_made_yet_is_written_there_and_the_report_is_whole(tmp_path: Path) -> None:
    """The run makes the --junit file's folder as it makes --out (inside it, beside it, or deeper): the check before
    the run is that it can; after the run the report and the file are whole."""
    for junit in (tmp_path / "out-a" / "junit.xml", tmp_path / "junit" / "nightly" / "x.xml"):
        out = tmp_path / ("out-a" if junit.parent.name == "out-a" else "out-b")
        done, _ = _run(["--junit", str(junit)], out)
        assert done.returncode in (0, 1), done.stdout + done.stderr  # judged, not refused or failed writing
        assert junit.read_text().startswith("<?xml") and (out / "summary.json").is_file() and (out / "run.toml").is_file()


def test_an_existing_report_folder_is_refused_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.json").write_text('{"older": "run"}\n')
    done, took = _run(FIXED, out)
    assert done.returncode == 2 and "--out" in done.stderr and "--force" in done.stderr, done.stderr
    assert took < STARTS_WITHIN_S and json.loads((out / "summary.json").read_text()) == {"older": "run"}
    forced, _ = _run(FIXED + ["--force"], out)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert json.loads((out / "summary.json").read_text())["target"] == "ref-gather:fixed"
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is as good as a new one
    assert _run(FIXED, empty)[0].returncode == 0


def test_report_refuses_a_truncated_table(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done, _ = _run(FIXED, out)
    assert done.returncode == 0, done.stdout + done.stderr
    report = [sys.executable, "-m", "bench", "report", str(out)]
    assert subprocess.run(report, capture_output=True, text=True).returncode == 0
    table = out / "trajectories.csv"
    if not table.exists():
        pytest.skip("tables are Parquet here (pyarrow installed)")
    whole = table.read_bytes()
    table.write_bytes(whole[: len(whole) - 7])  # cut inside the last row
    cut = subprocess.run(report, capture_output=True, text=True)
    assert cut.returncode != 0 and "trajectories.csv" in cut.stderr and "truncated" in cut.stderr, cut.stderr
    table.write_bytes(b"".join(whole.splitlines(keepends=True)[:-1]))  # a whole row gone
    short = subprocess.run(report, capture_output=True, text=True)
    assert short.returncode != 0 and "rows" in short.stderr and "Traceback" not in short.stderr, short.stderr


def test_report_and_load_report_name_a_cut_off_summary_json(tmp_path: Path) -> None:
    from bench import load_report

    out = tmp_path / "report"
    done, _ = _run(FIXED, out)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = out / "summary.json"
    whole = summary.read_text()
    summary.write_text(whole[: len(whole) // 2])  # cut off, as a full disk or a killed copy leaves it
    cut = subprocess.run([sys.executable, "-m", "bench", "report", str(out)], capture_output=True, text=True)
    named = f"{summary}: not valid JSON (line "
    assert cut.returncode == 2 and named in cut.stderr and "cut off" in cut.stderr, cut.stderr
    assert "Traceback" not in cut.stderr
    with pytest.raises(ValueError, match=re.escape(named)):
        load_report(out)  # the notebook API says the same


def test_a_run_whose_target_sent_no_request_is_no_sweep_pass() -> None:
    summary = {"violations": [], "trajectories": 8, "fidelity": {"requests": 0},
               "throughput": {"requests_per_s": 0.0}}
    assert outcome_of(Finished(0, False, 1.0, ""), summary) == "no_requests"
    summary["fidelity"]["requests"] = 12
    assert outcome_of(Finished(0, False, 1.0, ""), summary) == "ok"


def test_a_sweep_of_a_target_that_never_calls_the_server_fails(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "bench", "sweep", "--plan", "seed-000", "--target",
                           "tests.hardening_targets:NeverCallsTheServer", "--rates", "0.01", "--seeds", "1",
                           "--n", "8", "--time-scale", "0", "--jobs", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    row = (out / "sweep.csv").read_text().splitlines()
    assert len(row) == 2 and ",no_requests," in row[1], row
    assert json.loads((out / "sweep.json").read_text())["outcomes"]["no_requests"] == 1


@pytest.mark.parametrize("args, named", [
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--time-scale", "nan"], "--time-scale"),
    (["proxy", "--upstream", "http://127.0.0.1:9", "--context-length", "0"], "--context-length"),
    (["record", "--upstream", "http://127.0.0.1:9", "--out", "never-written.jsonl", "--port", "-1"], "--port"),
    (["worker", "--target", "ref-gather", "--idle-timeout", "-1"], "--idle-timeout"),
    (["sweep", "--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.1", "--seeds", "1",
      "--concurrency", "0", "--out", "never-written"], "--concurrency"),
    (["sweep", "--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.1", "--seeds", "1",
      "--watchdog", "inf", "--out", "never-written"], "--watchdog"),
], ids=lambda value: " ".join(value[:2] + value[-2:]) if isinstance(value, list) else None)
def test_the_other_commands_check_their_numbers_too(tmp_path: Path, args: list[str], named: str) -> None:
    clock = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=20,
                          cwd=tmp_path)
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert time.monotonic() - clock < 2.0 and list(tmp_path.iterdir()) == []
