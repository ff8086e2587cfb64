"""Targets the old watchdog misjudged: requests that flow without finishing anything, and correct rollouts
that finish everything but say so only at the end. Plugged in by `module:attr`, as a user's own would be.

Options (`job.options`, `--target-option KEY=VALUE`): `pidfile` (write "worker_pid child_pid" there once
running), `child` (spawn `sleep 300` first, to see the process group go), `sleep_s` (pause per request),
`give_up_s` (a looping target stops after this long, so an old bench that counted requests as progress
ends too, and its test fails instead of hanging).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from array import array
from pathlib import Path

import aiohttp

from bench import Emit, RolloutJob, SampleRecord, TrajectorySpec
from bench.replay.store import TraceStore
from bench.targets.client import generate


def _started(job: RolloutJob) -> None:
    """Spawn the child, then write the pid file (both when asked)."""
    child = subprocess.Popen(["sleep", "300"]) if job.options.get("child") else None
    if job.options.get("pidfile"):
        path = Path(job.options["pidfile"])
        path.with_suffix(".tmp").write_text(f"{os.getpid()} {child.pid if child else 0}\n")
        path.with_suffix(".tmp").rename(path)  # the test reads whole lines only


def _record(spec: TrajectorySpec, outcome: str = "completed") -> SampleRecord:
    return SampleRecord(spec.id, spec.group, outcome, prompt_length=len(spec.prompt_ids))


async def _ask(http: aiohttp.ClientSession, job: RolloutJob, spec: TrajectorySpec) -> None:
    await generate(http, job.base_url, spec, spec.prompt_ids, dict(spec.sampling_params))


class LoopsOnOneTrajectory:
    """Asks for its first trajectory's answer again and again, never emits: a retry loop that never gives up."""

    name = "livelock:one-trajectory"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        spec, give_up = job.trajectories[0], time.monotonic() + float(job.options.get("give_up_s", 45.0))
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < give_up:
                await _ask(http, job, spec)
                await asyncio.sleep(0.01)


class StormsEveryTrajectory:
    """Answers every trajectory once, then asks for all of them again and again, never emitting: the
    first pass is progress, the storm after it is not."""

    name = "livelock:storm"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        give_up = time.monotonic() + float(job.options.get("give_up_s", 45.0))
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < give_up:
                for spec in job.trajectories:
                    await _ask(http, job, spec)


class EmitsAtTheEnd:
    """Correct, and slow: one trajectory at a time with a pause per request, every record emitted at the
    very end (as slime's `generate_rollout` returns its whole batch)."""

    name = "livelock:emits-at-the-end"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                await asyncio.sleep(float(job.options.get("sleep_s", 0.1)))
                await _ask(http, job, spec)
        for spec in job.trajectories:
            emit(_record(spec))


class SlowMultiTurn:
    """Correct, and slow: replays each trajectory's recorded turns one at a time (the exact recorded
    requests) with a pause per turn, and emits each record when its trajectory is done."""

    name = "livelock:slow-multi-turn"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        store = TraceStore.load(job.options["trace"], groups_of=[s.id for s in job.trajectories])
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                recorded = store.by_id[spec.id]
                try:
                    for turn in recorded.turns:
                        await asyncio.sleep(float(job.options.get("sleep_s", 0.1)))
                        ids = list(array("i", recorded.sequences[turn.sequence][: turn.input_len * 4]))
                        await generate(http, job.base_url, spec, ids, dict(spec.sampling_params))
                except aiohttp.ClientResponseError:  # a turn the trace recorded as an error (context overflow)
                    emit(_record(spec, "failed"))
                    continue
                emit(_record(spec))


class SlowButSteady:
    """Correct and making progress, one record at a time, but slower than its deadline allows."""

    name = "livelock:slow-but-steady"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                await asyncio.sleep(float(job.options.get("sleep_s", 0.2)))
                await _ask(http, job, spec)
                emit(_record(spec))


class SpawnsAndWaits:
    """Starts a child process, then waits forever: for killing the run around it."""

    name = "livelock:spawns-and-waits"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        await asyncio.Event().wait()


class SpawnsThenEnds:
    """Starts a child process, then ends as `end` says: return (after emitting), raise, or hang."""

    name = "livelock:spawns-then-ends"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        _started(job)
        end = job.options.get("end", "return")
        if end == "raise":
            raise RuntimeError("the rollout crashed, its child process still running")
        if end == "hang":
            await asyncio.Event().wait()
        for spec in job.trajectories:
            emit(_record(spec))
