"""The collector settings a run uses (`bench.orchestration.collector`) are the run's only: thresholds and frozen
objects are back as they were when the last run in the process ends, also after nested runs and a failed one."""

from __future__ import annotations

import asyncio
import gc

import pytest

from bench.orchestration import collector
from bench.orchestration.runner import RunConfig, run


def test_a_run_raises_the_young_threshold_freezes_what_is_loaded_and_puts_both_back() -> None:
    before = gc.get_threshold()
    with collector.tuned():
        assert gc.get_threshold()[0] >= collector.YOUNG_THRESHOLD and gc.get_threshold()[1:] == before[1:]
        collector.freeze_loaded()
        assert gc.get_freeze_count() > 0
        with collector.tuned():  # a second run in the same process (a sweep, a test suite)
            pass
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] >= collector.YOUNG_THRESHOLD  # still the first's
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_failing_run_puts_the_collector_back_too_and_freezing_outside_a_run_does_nothing() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), collector.tuned():
        collector.freeze_loaded()
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    collector.freeze_loaded()
    assert gc.get_freeze_count() == 0


def test_a_whole_run_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    result = asyncio.run(run(RunConfig(trace="rlvr-500", n=4, target="ref-gather:fixed", isolation="inline")))
    assert len(result.records) == 4
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_trace_loads_without_collections_and_is_frozen_after_but_only_inside_a_run() -> None:
    """`collector.loading()`: what a load allocates all survives it, so no young collection may walk it meanwhile
    (they cost a run of agentic-500 about 0.1 s) and the first after it must not either: it is frozen at once."""
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with collector.tuned():
            with collector.loading():
                assert not gc.isenabled()
                loaded = [[i] for i in range(3 * collector.YOUNG_THRESHOLD)]  # past the young threshold, thrice
            assert gc.isenabled() and collections == [] and gc.get_freeze_count() >= len(loaded)
        with collector.loading():  # outside a run: the collector is left alone
            assert gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.callbacks.remove(count)
