"""The worker's side of a multi-step run: call the target's rollout once per step, in this process.

Each step gets `job.for_step(k)` (its slice of the trajectories, `job.step = k`); the same adapter object serves
every step, so a framework that keeps state across steps keeps it. After each step the process is measured
(`resources`) and the bench is told the step ended, with its error if it raised: `POST /bench/step` on the
bench's server, written with asyncio streams (no thread, no HTTP library: nothing the measurement of the next
step would count). The bench answers once it has published the next step's weights. A step that raised ends the
run under `on_step_failure = "stop"`; under `"continue"` the next step runs, in the same process.

An adapter that drives its framework's trainer side has `async update_weights(job)`: it is awaited before every
step (step 0 too: a trainer pushes its weights before the first rollout), makes the admin calls the framework's
trainer makes (pause, flush, update, continue) and returns the weight version its trainer published. The report
then says the adapter published (`weights`), and the bench leaves the server's version to those calls. An adapter
whose framework's sync names no version to the server (AReaL's, verl's: the server's label cannot move) says so
with a class attribute `versionless_weight_sync = True`, reported with each step (`checks.weights_not_served`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from bench.isolation.exits import error_info, exits_as_errors
from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob

from . import STEP_ROUTE
from .resources import snapshot

REPORT_TIMEOUT_S = 60.0


class StepReportError(RuntimeError):
    """The bench did not take a step's report (its server refused it or did not answer)."""


async def post_step(base_url: str, report: dict[str, Any]) -> dict[str, Any]:
    """`POST /bench/step` with the step's report; the bench's answer (JSON)."""
    url = urlsplit(base_url)
    body = json.dumps(report, allow_nan=True).encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(url.hostname, url.port), REPORT_TIMEOUT_S)
    try:
        writer.write(f"POST {STEP_ROUTE} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), REPORT_TIMEOUT_S)
    finally:
        writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        raise StepReportError(f"{STEP_ROUTE} answered {head[:200]!r}: {payload[:500]!r}")
    return json.loads(payload or b"{}")


async def run_steps(target: Any, job: RolloutJob, emit: Emit, *, measure: bool = True,
                    on_prepared: Callable[[], None] | None = None) -> None:
    """Every step of `job` (`job.steps`), each reported to the bench before the next starts.

    `measure`: take the process's resources after each step (a worker; an inline run shares the bench's process,
    whose resources are not the target's). `on_prepared`: called once the first step's `prepare` is done."""
    prepare = getattr(target, "prepare", None)
    publish = getattr(target, "update_weights", None)  # the adapter drives the trainer side (its weight syncs)
    own = {task for task in (asyncio.current_task(),) if task is not None}
    running = [0]

    def handed_over(record: SampleRecord) -> None:
        """A record carries the step running when the rollout handed it to the trainer (the step that trains on
        it) and the moment it did (the weights then: one step may train several times, syncing after each); the
        bench keeps both for the lag check and then stamps the record with its trajectory's step."""
        record.step = running[0]
        emit(record if record.handed_over_at is not None else stamped(record))  # a thread's adapter stamped it there

    for step in range(job.steps):
        running[0] = step
        step_job = job.for_step(step)
        started = time.time()
        error: ErrorInfo | None = None
        trainer_version: str | None = None
        try:
            if publish is not None:
                trainer_version = await published(target, publish, step_job)
                started = time.time()  # the step's weights are what the server holds from here
            if prepare is not None:  # per step: `run` owns the teardown of what `prepare` started
                await asyncio.to_thread(prepare, step_job)
            if step == 0 and on_prepared is not None:
                on_prepared()
            rollout = asyncio.create_task(exits_as_errors(target.run(step_job, handed_over)),
                                          name=f"target {target.name} step {step}")
            await rollout
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the bench gave up on the run (a hang): not this step's result
            error = error_info(asyncio.CancelledError())
        except BaseException as raised:  # noqa: BLE001 - a step raising is its result, reported in full
            error = error_info(raised)
        returned = time.time()
        last = step == job.steps - 1 or (error is not None and job.on_step_failure == "stop")
        answer = await post_step(job.base_url, {
            "step": step, "started": started, "returned": returned, "last": last,
            "error": None if error is None else {"type": error.type, "message": error.message,
                                                 "traceback": error.traceback, "trajectory": error.trajectory},
            "weights": None if publish is None else {
                "by": "adapter", "version": trainer_version,
                "versionless": bool(getattr(target, "versionless_weight_sync", False))},
            "resources": snapshot(own) if measure else None})
        if last or answer.get("next") is None:  # the bench stopped the run (it gave up waiting): no next step
            return


def stamped(record: SampleRecord) -> SampleRecord:
    """`record` with the moment it was handed over: for an adapter whose trainer runs in a thread and passes records
    to the event loop (`call_soon_threadsafe`), so a weight sync the thread makes right after is not taken as the
    weights the record was trained against (the loop may run the emit after it)."""
    record.handed_over_at = time.time()
    return record


async def published(target: Any, update_weights: Callable[[RolloutJob], Any], job: RolloutJob) -> str | None:
    """The adapter's weight sync for `job.step`; the version its trainer published (a str, or None: not said)."""
    version = await exits_as_errors(update_weights(job))
    if version is not None and not isinstance(version, str):
        raise TypeError(f"target {target.name!r}: update_weights(job) must return the published weight version "
                        f"as a str (or None), got {version!r}")
    return version
