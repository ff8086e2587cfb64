"""The open-instruct adapter's end-of-data rule on the results queue (`trainer.ResultsQueue.get`), without Ray:
Empty only when nothing is in flight and draws are owed (data the bench has not handed over yet could bring a
result); a pipeline starved with nothing owed keeps waiting, as open-instruct does, so the watchdog reports it."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest

from bench.targets.frameworks.open_instruct.feed import PromptQueue
from bench.targets.frameworks.open_instruct.trainer import POLL_S, ResultsQueue


def _results(owed: int) -> tuple[ResultsQueue, PromptQueue]:
    prompts = PromptQueue(queue.Queue(), lambda index: [f"t{index}"])
    prompts.owed = owed
    return ResultsQueue(queue.Queue(), prompts, lambda: None), prompts


def test_nothing_in_flight_with_draws_owed_reports_empty() -> None:
    results, _ = _results(owed=1)
    with pytest.raises(queue.Empty):
        results.get()


def test_a_starved_pipeline_with_nothing_owed_keeps_waiting() -> None:
    results, _ = _results(owed=0)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(results.get()), daemon=True)
    waiter.start()
    waiter.join(3 * POLL_S)
    assert waiter.is_alive() and got == []  # still waiting: no Empty ended the step
    results.real.put(SimpleNamespace(index=0, model_step=0))  # a result arriving ends the wait
    waiter.join(3 * POLL_S)
    assert not waiter.is_alive() and len(got) == 1 and results.handed == {0: 0}
