"""`rollout-bench run`: server + target + watchdog + invariants, for one trace, plan and target.

The server runs in this process on an ephemeral port; the target's rollout code runs as a
task beside it. Whatever the target does (returns, raises, hangs), the runner ends with one
sample record per dispatched trajectory, the server's request and fault logs, and the
violations the invariants found. Nothing the target started outlives the run.
"""

from __future__ import annotations

import asyncio
import io
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

from faults import FaultEvent, Plan

from .invariants import Bounds, HangReport, RunView, Violation, check_all
from .paths import DEFAULT_TRACE
from .progress import progress_bar
from .replay.store import RecordedTrajectory
from .server import BenchServer
from .server.request_log import RequestRecord
from .targets import DEFAULT_TARGET, ErrorInfo, RolloutJob, SampleRecord, TargetAdapter, TrajectorySpec
from .targets import resolve_target
from .tokenizer import tokenizer_path

DEFAULT_PLAN = "seed-000"


@dataclass
class RunConfig:
    trace: str = DEFAULT_TRACE
    plan: Plan | None = None
    target: str = DEFAULT_TARGET
    n: int | None = None
    trajectories: list[str] | None = None  # run only these (repro files)
    concurrency: int = 64
    time_scale: float = 0.0
    watchdog_s: float = 30.0
    invariants: list[str] | None = None
    bounds: Bounds = field(default_factory=Bounds)
    server_options: dict[str, Any] = field(default_factory=dict)
    target_options: dict[str, Any] = field(default_factory=dict)  # handed to the target as `job.options`


@dataclass
class RunResult:
    config: RunConfig
    target: str
    trace_path: str
    context_length: int
    records: list[SampleRecord]
    requests: list[RequestRecord]
    fault_events: list[FaultEvent]
    violations: list[Violation]
    batch_error: ErrorInfo | None
    hang: HangReport | None
    started: float
    duration_s: float
    orphans_cancelled: int

    @property
    def ok(self) -> bool:
        return not self.violations


def _spec(trajectory: RecordedTrajectory) -> TrajectorySpec:
    prompt = list(array("i", trajectory.sequences[0][: trajectory.prompt_len * 4]))
    return TrajectorySpec(trajectory.id, trajectory.group_id, prompt, trajectory.prompt_text,
                          trajectory.prompt_messages, trajectory.prompt_tools, dict(trajectory.first_sampling_params),
                          len(trajectory.turns))


async def _watch(task: asyncio.Task[None], progress: Callable[[], tuple[int, int]], idle_s: float) -> bool:
    """Wait for the target; True if it made no progress (records, requests) for `idle_s` seconds."""
    last, changed = progress(), time.monotonic()
    while not task.done():
        await asyncio.wait({task}, timeout=min(0.25, idle_s))
        now = progress()
        if now != last:
            last, changed = now, time.monotonic()
        elif time.monotonic() - changed > idle_s:
            return True
    return False


def _stack(task: asyncio.Task[Any]) -> str:
    buffer = io.StringIO()
    task.print_stack(file=buffer)
    return buffer.getvalue()


async def _cancel(tasks: set[asyncio.Task[Any]], timeout: float = 10.0) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


async def run(config: RunConfig, *, show_progress: bool = False) -> RunResult:
    """Run one bench scenario to the end, whatever the target does."""
    target: TargetAdapter = resolve_target(config.target)
    started, clock = time.time(), time.monotonic()
    async with BenchServer(config.trace, plan=config.plan, time_scale=config.time_scale,
                           **config.server_options) as server:
        store = server.context.store
        chosen = store.trajectories if config.trajectories is None else [
            store.by_id[t] for t in config.trajectories]
        chosen = chosen[: config.n] if config.n is not None else chosen
        specs = [_spec(t) for t in chosen]
        plan = config.plan
        job = RolloutJob(server.url, specs, store.header.context_length, tokenizer_path(), config.concurrency,
                         plan.seed if plan else 0, [r for r in (plan.rules if plan else ()) if not r.fault.server_side],
                         dict(config.target_options))
        records: dict[str, SampleRecord] = {}
        emitted: dict[str, int] = {}
        bar = progress_bar(total=len(specs), desc=target.name, enabled=show_progress)
        accepting = True

        def emit(record: SampleRecord) -> None:
            if not accepting:
                return  # an orphan reporting after the rollout ended: the framework threw it away
            emitted[record.trajectory] = emitted.get(record.trajectory, 0) + 1
            if record.trajectory not in records:
                records[record.trajectory] = record
                bar.update(1)

        before = asyncio.all_tasks()
        task = asyncio.create_task(target.run(job, emit), name=f"target {target.name}")
        hung = await _watch(task, lambda: (len(records), len(server.log)), config.watchdog_s)
        accepting = False
        bar.close()
        hang = batch_error = None
        if hung:
            pending = {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}
            hang = HangReport(config.watchdog_s, [_stack(t) for t in pending])
        elif task.exception() is not None:
            batch_error = ErrorInfo.of(task.exception())  # type: ignore[arg-type]
        orphans = {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}
        await _cancel(orphans)
        for spec in specs:
            if spec.id not in records:
                cause = batch_error or (ErrorInfo("Hang", f"no progress for {config.watchdog_s:g} s", "")
                                        if hang else ErrorInfo("Missing", "the target returned no record", ""))
                records[spec.id] = SampleRecord(spec.id, spec.group, "lost", error=cause,
                                                prompt_length=len(spec.prompt_ids))
        duration = time.monotonic() - clock
        ordered = [records[s.id] for s in specs]
        view = RunView(ordered, list(server.log.records), list(server.context.faults.log.events), plan,
                       {s.id: s.group for s in specs}, store.header.context_length, target.fail_fast,
                       batch_error, hang, duration, config.bounds, emitted)
        violations = check_all(view, config.invariants)
        return RunResult(config, target.name, str(store.path), store.header.context_length, ordered,
                         view.requests, view.fault_events, violations, batch_error, hang, started, duration,
                         len(orphans))
