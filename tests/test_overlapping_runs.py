"""Process-wide state that runs and servers in one process share, restored right whatever order they end in: the
inline run marker (`bench.isolation.inline_markers`) and the garbage collector (`bench.orchestration.collector`)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from bench import RunConfig, run
from bench.isolation.escapees import RUN_MARKER
from bench.orchestration import collector
from bench.server import ServerThread
from tests.process_helpers import running, wait_until_gone

TARGET = "tests.hardening_targets:ChildrenOnCue"


def _until(condition, what: str, timeout_s: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)
    return value


def _pids(path: Path, count: int) -> list[int]:
    if not path.exists():
        return []
    pids = [int(p) for p in path.read_text().split()]
    return pids if len(pids) >= count else []


class _RunThread(threading.Thread):
    """One inline run on its own thread and event loop, as a test suite or a program running runs side by side does
    (in one event loop a run cancels the tasks started after it, so overlapping runs live on threads)."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(daemon=True)
        self.config, self.error = config, None

    def run(self) -> None:
        try:
            asyncio.run(run(self.config))
        except BaseException as error:  # noqa: BLE001 - the test reads it
            self.error = error


def test_overlapping_inline_runs_each_keep_their_marker_and_end_their_own_children(tmp_path: Path) -> None:
    """Run A starts, run B starts, A ends first: B's children started after that are still marked and die with B,
    the children both may have started survive A's end, and the variable is gone once both ended. (Each run used to
    restore the value it saw at its start: A's end unmarked B, B's end put A's marker back for good.)"""
    assert RUN_MARKER not in os.environ

    def config(name: str) -> RunConfig:
        return RunConfig(trace="rlvr-500", n=2, target=TARGET, isolation="inline", watchdog_s=600.0,
                         target_options={"dir": str(tmp_path), "name": name})

    first, second = _RunThread(config("a")), _RunThread(config("b"))
    a: list[int] = []
    b: list[int] = []
    try:
        first.start()
        a = _until(lambda: _pids(tmp_path / "a.pids", 1), "run A's first child")
        second.start()
        b = _until(lambda: _pids(tmp_path / "b.pids", 1), "run B's first child")
        (tmp_path / "a.end").touch()
        first.join(120)
        assert not first.is_alive() and first.error is None, first.error
        assert running(b[0])  # it may be A's or B's (started while both went on): B still goes
        assert os.environ.get(RUN_MARKER), "run B's marker is gone while it runs"
        (tmp_path / "b.more").touch()
        b = _until(lambda: _pids(tmp_path / "b.pids", 2), "run B's second child")
        (tmp_path / "b.end").touch()
        second.join(120)
        assert not second.is_alive() and second.error is None, second.error
        assert wait_until_gone(a + b, 5.0) == []  # A's child with A, B's both with B
        assert RUN_MARKER not in os.environ
    finally:
        for name in ("a", "b"):
            (tmp_path / f"{name}.end").touch()
        for pid in a + b:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_server_inside_a_run_that_ends_first_keeps_its_collector_settings() -> None:
    """The run holds the collector at its threshold, a server at its (higher, deliberate) one; the run ends first. The
    server serves on with its own, and once it stops the process has the collector it had before either started.
    (Each used to restore what it saw at its start: the run's end gave the serving server the defaults, and the
    server's stop left the run's threshold in place for good.)"""
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    assert collector.SERVING_THRESHOLD == 50_000 and collector.RUN_THRESHOLD == 10_000
    with ExitStack() as in_run:
        in_run.enter_context(collector.tuned())
        assert gc.get_threshold()[0] == max(before[0], collector.RUN_THRESHOLD)
        with ServerThread("rlvr-500"):
            assert gc.get_threshold()[0] == max(before[0], collector.SERVING_THRESHOLD)
            assert gc.get_freeze_count() > frozen_before
            in_run.close()  # the run ends while the server serves
            assert gc.get_threshold()[0] == max(before[0], collector.SERVING_THRESHOLD)
            assert gc.get_freeze_count() > frozen_before
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before


def test_a_server_that_stops_inside_a_run_leaves_the_run_its_threshold() -> None:
    before = gc.get_threshold()
    with collector.tuned():
        with ServerThread("rlvr-500"):
            pass
        assert gc.get_threshold()[0] == max(before[0], collector.RUN_THRESHOLD)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
