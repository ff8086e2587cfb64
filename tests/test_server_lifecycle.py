"""In-process start and stop leave no task, socket or thread behind."""

from __future__ import annotations

import asyncio
import os
import threading

import aiohttp

from bench.server import BenchServer, ServerThread
from bench.server.app import load_context
from tests.server_helpers import request, turn_input


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _cycle(context) -> None:  # type: ignore[no-untyped-def]
    async with BenchServer(context=context) as server:
        trajectory = server.context.store.trajectories[0]
        async with aiohttp.ClientSession() as http:
            pending = asyncio.create_task(http.post(f"{server.url}/generate",
                                                    json={"input_ids": turn_input(trajectory, 0)}))
            await asyncio.sleep(0.05)  # the request is generating (slow time scale) when the server stops
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


def test_start_stop_leaks_nothing() -> None:
    context = load_context("rlvr-500", time_scale=1000.0)

    async def main() -> None:
        await _cycle(context)  # warm-up: imports, lazy pools
        before = _open_fds()
        for _ in range(5):
            await _cycle(context)
        await asyncio.sleep(0)
        assert _open_fds() == before
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
    assert not context.state.inflight


def test_server_thread_stops_its_thread() -> None:
    before = threading.active_count()
    with ServerThread("rlvr-500") as server:
        assert request(server.url, "/health").status == 200
        assert threading.active_count() == before + 1
    assert threading.active_count() == before
