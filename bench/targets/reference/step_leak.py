"""`ref-step-leak`: a rollout called once per training step that leaves something behind each step (for
`run --steps K`, `bench.steps`).

Each step generates its trajectories once over SGLang's `/generate` (as `ref-gather:fixed` does) and, beside
them, starts what rollout code starts per step; `--target-option leak=KIND` picks which:

- `tasks` (default): an over-sampling task (partial rollouts for the next batch) that keeps asking the server
  for one more answer to the step's first trajectory;
- `threads`: a per-step metrics reporter thread waiting on its stop event;
- `sockets`: a connection to the server opened per step (a weight-sync or health channel);
- `children`: a helper process per step (a reward model server, a sandbox);
- `memory`: 24 MiB of per-step rollout data kept in a process-wide cache.

- `unfixed`: nothing it started is stopped when the step returns; the next step starts another.
- `fixed`: the step stops, joins, closes, ends or drops it before returning.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.records.sample import SampleRecord

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, sample_of
from . import ReferenceTarget

LEAKS = ("tasks", "threads", "sockets", "children", "memory")
_CACHE: list[bytes] = []  # process-wide, as a module-level rollout cache is


class RefStepLeak(ReferenceTarget):
    family = "ref-step-leak"

    def __init__(self, variant: str = "unfixed") -> None:
        super().__init__(variant)
        self._background: list[Any] = []  # what the unfixed variant keeps referring to after a step returned

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        leak = str(job.options.get("leak", "tasks"))
        if leak not in LEAKS:
            raise ValueError(f"ref-step-leak: leak={leak!r}; one of {', '.join(LEAKS)}")
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            started = await self._start(leak, job, http if self.fixed else None)
            try:
                samples = await asyncio.gather(*(self._sample(http, limit, job, spec) for spec in job.trajectories))
            finally:
                if self.fixed:
                    await _stop(leak, started)
        for sample in samples:
            emit(sample)

    async def _start(self, leak: str, job: RolloutJob, http: aiohttp.ClientSession | None) -> Any:
        if leak == "tasks":
            started: Any = asyncio.create_task(_oversample(job, http), name=f"oversample step {job.step}")
        elif leak == "threads":
            stop = threading.Event()
            thread = threading.Thread(target=stop.wait, name=f"metrics step {job.step}", daemon=True)
            thread.start()
            started = (thread, stop)
        elif leak == "sockets":
            url = urlsplit(job.base_url)
            started = await asyncio.to_thread(socket.create_connection, (url.hostname, url.port))
        elif leak == "children":
            started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        else:
            started = b"r" * (24 << 20)  # written, so resident
            _CACHE.append(started)
        if not self.fixed:
            self._background.append(started)
        return started

    async def _sample(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                      spec: TrajectorySpec) -> SampleRecord:
        async with limit:
            body = await generate(http, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
        return sample_of(spec, body)


async def _oversample(job: RolloutJob, http: aiohttp.ClientSession | None) -> None:
    """One more answer for the step's first trajectory, again and again (a next batch being filled); the unfixed
    variant's task has its own session, which outlives the step's."""
    spec = job.trajectories[0]
    own = http is None
    session = aiohttp.ClientSession() if own else http
    assert session is not None
    try:
        while True:
            await asyncio.sleep(0.1)
            try:
                await generate(session, job.base_url, spec, spec.prompt_ids, spec.sampling_params)
            except aiohttp.ClientError:
                pass
    finally:
        if own:
            await session.close()


async def _stop(leak: str, started: Any) -> None:
    """The fix: what the step started ends with it."""
    if leak == "tasks":
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)
    elif leak == "threads":
        thread, stop = started
        stop.set()
        await asyncio.to_thread(thread.join)
    elif leak == "sockets":
        started.close()
    elif leak == "children":
        started.terminate()
        await asyncio.to_thread(started.wait)
    else:
        _CACHE.clear()
