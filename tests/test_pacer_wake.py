"""`state.Wake`: the pacer's wake-up (set by aborts and pauses), waited on with a deadline."""

from __future__ import annotations

import asyncio

from bench.server.state import Pacer, ServerState, Wake


def test_a_wait_ends_when_set_or_at_its_deadline_and_a_cancelled_one_leaves_nothing_behind() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        wake = Wake()
        started = loop.time()
        assert await wake.wait(0.05) is False  # nothing set it: the deadline
        assert loop.time() - started >= 0.05
        loop.call_later(0.01, wake.set)
        started = loop.time()
        assert await wake.wait(5) is True  # set meanwhile: long before the deadline
        assert loop.time() - started < 1
        assert await wake.wait(5) is True  # still set: at once
        wake.clear()
        task = asyncio.ensure_future(wake.wait())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert wake._waiter is None
        wake.set()  # no waiter left to resolve: no error

    asyncio.run(run())


def test_an_abort_wakes_a_paced_answer_at_once() -> None:
    async def run() -> None:
        state = ServerState()
        entry = state.register("r1")
        pacer = Pacer(state, entry)
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, state.abort, "r1")
        started = loop.time()
        assert await pacer.sleep(10) is False
        assert loop.time() - started < 1
        assert 0.015 <= pacer.active < 1  # the time played before the abort, not the whole sleep

    asyncio.run(run())
