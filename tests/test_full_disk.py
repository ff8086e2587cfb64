"""A full disk or a file size limit during a run: found up front where it can be (the free space of --out's file
system), else a clear error naming the file, a non-zero exit, and nothing half-written (every file whole or absent).

Real mechanisms, no stubs: RLIMIT_FSIZE in the run's process (the kernel's EFBIG, anywhere), and where this user may
mount one, a tiny tmpfs that really fills (ENOSPC)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

BASE = [sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "4", "--time-scale", "0",
        "--repro-reruns", "0", "--watchdog", "10", "--target", "ref-gather:fixed", "--plan", "none"]
STARTS_WITHIN_S = 5.0  # as tests/test_cli_validation.py: exit 2 before anything starts


def _no_half_written(out: Path) -> list[str]:
    """Every file in the report folder: none a temporary one, every JSON and CSV complete."""
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if "partial" in n], names
    for path in out.iterdir():
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".csv":
            assert path.read_bytes().endswith(b"\n"), path
    return names


def test_a_file_size_limit_while_writing_the_report_names_the_file_and_leaves_nothing_half_written(
        tmp_path: Path) -> None:
    out = tmp_path / "report"
    limit = 20_000  # the run's tables fit; its first plot does not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(BASE + ["--out", str(out)], capture_output=True, text=True, timeout=300,
                          preexec_fn=limited)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"cannot write {out}" in done.stderr and "file too large" in done.stderr, done.stderr[-3000:]
    assert "the report in" in done.stderr and "is incomplete" in done.stderr and "the run itself passed" in done.stderr
    names = _no_half_written(out)
    assert "summary.json" in names  # what was written before the limit is whole


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs, where this user may mount one (root with CAP_SYS_ADMIN); skipped otherwise."""
    mount = tmp_path / "disk"
    mount.mkdir()
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                           text=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({tried.stderr.strip() or 'mount failed'}); the RLIMIT_FSIZE test "
                    "covers the write path")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_too_little_free_space_is_refused_before_the_run_starts(tiny_disk: Path) -> None:
    clock = time.monotonic()
    done = subprocess.run(BASE + ["--out", str(tiny_disk / "report")], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - clock
    assert done.returncode == 2 and took < STARTS_WITHIN_S, (took, done.stderr)
    assert f"--out {tiny_disk / 'report'}: only" in done.stderr and "needs at least 64 MB" in done.stderr
    assert "ROLLOUT_BENCH_MIN_FREE_MB" in done.stderr and not (tiny_disk / "report").exists()


def test_a_disk_that_fills_during_the_report_names_the_file_and_leaves_nothing_half_written(tiny_disk: Path) -> None:
    filler = tiny_disk / "filler"
    with filler.open("wb") as handle:  # all but ~24 KB of the 1 MB
        handle.write(b"\0" * (1024 * 1024 - 24 * 1024))
    out = tiny_disk / "report"
    done = subprocess.run(BASE + ["--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ROLLOUT_BENCH_MIN_FREE_MB": "0"})  # past the up-front check
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"cannot write {out}" in done.stderr and "no space left on the device" in done.stderr, done.stderr[-3000:]
    _no_half_written(out)


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE in this process for the block (the soft limit: restored after; Python ignores SIGXFSZ, so a write
    past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _writers(folder: Path) -> dict[str, tuple[Path, Callable[[], object]]]:
    """The sweep's and the step report's writers, each given more than the limit below lets through."""
    from bench.steps.report import write_step_report
    from bench.sweep.sweeper import _write_atomic
    from bench.sweep.table import write_sweep_tables

    big = [{"step": i, "note": "x" * 40} for i in range(500)]
    return {"sweep.json": (folder / "sweep.json", lambda: _write_atomic(folder / "sweep.json", "x" * 50_000)),
            "sweep.csv": (folder / "sweep.csv", lambda: write_sweep_tables([{"plan": "p" * 40}] * 500, [], folder)),
            "steps.csv": (folder / "steps.csv", lambda: write_step_report({"steps": {"rows": big}}, folder))}


@pytest.mark.parametrize("name", ["sweep.json", "sweep.csv", "steps.csv"])
def test_the_sweep_files_and_steps_csv_are_written_whole_or_not_at_all(tmp_path: Path, name: str) -> None:
    """They go through `atomic_write` as every report file does: a limit mid-way is a `WriteError` naming the file
    and leaves no file (steps.csv was written in place, half of it left; the sweep's own writers named the
    temporary file)."""
    from bench.records.atomic_write import WriteError

    path, write = _writers(tmp_path)[name]
    with _file_size_limit(8_000), pytest.raises(WriteError, match=f"cannot write {path}: file too large"):
        write()
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
