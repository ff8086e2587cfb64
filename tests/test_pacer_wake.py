"""`state.Wake`: the pacer's wake-up (set by aborts and pauses), waited on with a deadline."""

from __future__ import annotations

import asyncio

from bench.server.state import Pacer, ServerState, SharedTimer, Wake


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


def test_shared_deadlines_expire_in_order_on_one_loop_timer_and_an_early_set_is_skipped() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        timers = SharedTimer()
        wakes = [Wake() for _ in range(4)]
        delays = [0.04, 0.01, 0.03, 0.02]
        ended: dict[int, float] = {}
        started = loop.time()

        async def wait(index: int) -> bool:
            result = await wakes[index].wait(delays[index], timers)
            ended[index] = loop.time() - started
            return result

        tasks = [asyncio.ensure_future(wait(i)) for i in range(4)]
        await asyncio.sleep(0)  # every deadline set
        armed = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(armed) == 1  # one loop timer for the four deadlines
        loop.call_later(0.015, wakes[2].set)  # before its 0.03 deadline: woken then, with True
        assert await asyncio.gather(*tasks) == [False, False, True, False]
        assert [i for i, _ in sorted(ended.items(), key=lambda item: item[1])] == [1, 2, 3, 0]
        for index in (0, 1, 3):
            assert ended[index] >= delays[index]
        assert ended[2] < 0.03
        assert timers._heap == []  # type: ignore[attr-defined]
        assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]  # none left armed

    asyncio.run(run())


def test_a_shared_timer_moves_to_a_new_loop_only_once_the_old_loop_has_no_deadline_awaited() -> None:
    timers = SharedTimer()

    async def wait(delay: float) -> bool:
        return await Wake().wait(delay, timers)

    assert asyncio.run(wait(0.01)) is False  # on a first loop
    assert asyncio.run(wait(0.01)) is False  # the first loop's deadlines all passed: the second one takes it over

    async def stranded() -> None:  # a deadline left awaited on a loop that stops running
        loop = asyncio.get_running_loop()
        assert timers.expire(loop, loop.time() + 60, loop.create_future())

    other = asyncio.new_event_loop()
    try:
        other.run_until_complete(stranded())
        # a live deadline of another loop: a wait here gets a loop timer of its own, and still ends at its deadline
        assert asyncio.run(wait(0.01)) is False
        assert timers._loop is other  # type: ignore[attr-defined]
    finally:
        other.close()
