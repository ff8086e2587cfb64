"""`rollout-bench run`: server + target + watchdog + invariants, for one trace, plan and target.

The server runs in this process on an ephemeral port; the target's rollout code runs in a
worker process (`isolation="process"`, the default; optionally under another interpreter,
`python=`), or as a task beside the server (`isolation="inline"`, for the reference targets'
own tests and debugging). Whatever the target does (returns, raises, hangs, dies), the runner
ends with one sample record per dispatched trajectory, the server's request and fault logs,
and the violations the invariants found. Nothing the target started outlives the run.
"""

from __future__ import annotations

import asyncio
import io
import math
import threading
import time
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from bench.invariants import Bounds, HangReport, RunView, Violation, check_all, provenance
from bench.invariants.fault_reach import with_reach
from bench.isolation import IsolatedTarget, TargetCrashed, TargetStartError
from bench.isolation import inline_markers
from bench.isolation.exits import error_info, exits_as_errors, print_awaited
from bench.progress import progress_bar
from bench.records import attribution
from bench.records.request_log import RequestRecord
from bench.records.sample import ErrorInfo, SampleRecord
from bench.records.served_tokens import ServedTokens
from bench.replay.store import RecordedTrajectory
from bench.steps import run as steps
from bench.targets import (DEFAULT_TARGET, Emit, RolloutJob, TargetAdapter, TrajectorySpec, check_target_spec,
                           framework_info_of, resolve_target, tokens_source_of)
from bench.targets.frameworks.envs import target_python
from bench.targets.registry import engine_of
from bench.trace.shipped import DEFAULT_TRACE, resolve_trace
from faults import FaultEvent, Plan

from . import collector
from .interrupt import INTERRUPTED, Interrupt
from .known import KnownFinding, KnownViolation, resolve_known, split

DEFAULT_PLAN = "seed-000"
ISOLATIONS = ("process", "inline")


@dataclass
class RunConfig:
    trace: str = DEFAULT_TRACE
    plan: Plan | None = None
    target: str = DEFAULT_TARGET
    n: int | None = None
    trajectories: list[str] | None = None  # run only these (repro files)
    concurrency: int = 64
    time_scale: float = 0.0
    watchdog_s: float = 30.0  # seconds without a finished sample or a newly answered turn: a hang or a livelock
    deadline_s: float = 3600.0  # any run ends after this many seconds (its start-up included): a liveness violation
    startup_s: float = 300.0  # a worker's interpreter start and framework imports (not counted as a hang)
    invariants: list[str] | None = None
    bounds: Bounds = field(default_factory=Bounds)
    server_options: dict[str, Any] = field(default_factory=dict)
    target_options: dict[str, Any] = field(default_factory=dict)  # handed to the target as `job.options`
    isolation: str = "process"  # "process": a worker process per run; "inline": a task in this process
    python: str | None = None  # the worker's interpreter (default: the target's built environment, else this one)
    worker_log: str | None = None  # also write the worker's output here (the report has it as worker.log anyway)
    warm: bool = True  # fork the worker from a warm worker (`rollout-bench worker`) when one runs for the target
    known: str | None = None  # known findings (`bench.orchestration.known`): a shipped name or a TOML path
    # a live engine's URL: its answers, through the fault proxy, instead of the trace's (`bench.server.proxy`); the
    # trace then gives only the prompts and the trajectory ids, and replay fidelity does not apply
    upstream: str | None = None
    # the trace's tokenizer, when it is not the bench's (a recording of a real model): a local Hugging Face folder
    # the mock adapts answers with and the target loads as the job's tokenizer
    tokenizer_dir: str | None = None
    steps: int = 1  # training steps: the rollout called this many times in one worker (`bench.steps`)
    on_step_failure: str = "stop"  # "continue": after a step that raised, the next one runs in the same process
    compare_fresh: bool = False  # also rerun the last clean step in a fresh worker and compare (`bench.steps.fresh`)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation {self.isolation!r} is not one of {', '.join(ISOLATIONS)}")
        if self.python is not None and self.isolation != "process":
            raise ValueError("python= needs isolation='process': another interpreter means another process")
        self._check_numbers()

    def _check_numbers(self) -> None:
        """Values that would make a run meaningless fail here, naming the field, not as a hang after it."""
        if self.n is not None and self.n < 1:
            raise ValueError(f"n={self.n}: a run needs at least 1 trajectory")
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency}: needs at least 1 request in flight")
        for name in ("watchdog_s", "deadline_s", "startup_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}={value}: needs a finite number of seconds > 0")
        if not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise ValueError(f"time_scale={self.time_scale}: needs a finite number >= 0")
        steps.check_step_arguments(self.steps, self.on_step_failure, self.compare_fresh)


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
    isolation: str = "inline"
    worker: dict[str, Any] | None = None  # the worker process: interpreter, pid, CPU time, versions, log
    bench_cpu_s: float = 0.0  # CPU this process (server, checks; the target too when inline) used during the run
    target_returned_at: float | None = None  # unix time the rollout returned or raised
    known_violations: list[KnownViolation] = field(default_factory=list)  # matched a known finding: not failures
    known_file: str | None = None
    recorded_outcomes: dict[str, str | None] = field(default_factory=dict)  # the trace's outcome per trajectory
    served: ServedTokens | None = None  # what each identified request was served, token by token
    provenance: dict[str, str] = field(default_factory=dict)  # per trajectory: the provenance check's verdict
    tokens_source: str = "served"  # the target's declaration: "retokenized" when its framework re-tokenises text
    framework: dict[str, str] | None = None  # the framework's code: installed version, or checkout and commit
    worker_log: str | None = None  # the worker's output (the target's prints and logs), capped: `capped_log`
    # SIGINT/SIGTERM to the bench ended the run early: what it gathered is reported, marked so (`interruption`)
    interrupted: str | None = None
    violations_not_judged: int = 0  # found on trajectories the interruption cut off, or on the whole run: dropped
    steps: dict[str, Any] | None = None  # a multi-step run's per-step table and first violation (`bench.steps.run`)
    server: dict[str, str] | None = None  # the SGLang version and build the server played (`ServerConfig.played`)

    def __repr__(self) -> str:
        """Short: `asyncio.run` formats the finished main task's result when it restores the SIGINT handler, and
        the full dataclass repr of every record and request took 0.3 s of a 500-trajectory run's exit."""
        return (f"RunResult(target={self.target!r}, trace={self.trace_path!r}, records={len(self.records)}, "
                f"requests={len(self.requests)}, violations={len(self.violations)})")

    @property
    def ok(self) -> bool:
        return not self.violations


def _spec(trajectory: RecordedTrajectory) -> TrajectorySpec:
    prompt = list(array("i", trajectory.sequences[0][: trajectory.prompt_len * 4]))
    return TrajectorySpec(trajectory.id, trajectory.group_id, prompt, trajectory.prompt_text,
                          trajectory.prompt_messages, trajectory.prompt_tools, dict(trajectory.first_sampling_params),
                          len(trajectory.turns), trajectory.prompt_raw)


async def _started(task: asyncio.Task[None], target: TargetAdapter, limit_s: float,
                   prepared: asyncio.Event, interrupt: Interrupt | None) -> bool:
    """Wait until the target is loaded (an isolated target's worker said so) and has prepared for its job
    (`prepare(job)`, if it has one: a framework's own start-up, such as a Ray runtime and its actors);
    False if that did not happen within `limit_s` seconds (or the run was interrupted meanwhile)."""
    started = target.started if isinstance(target, IsolatedTarget) else prepared
    ready = asyncio.create_task(started.wait())
    waits = {task, ready}
    if interrupt is not None:
        waits.add(asyncio.create_task(interrupt.event.wait()))
    await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waits - {task}:
        waiter.cancel()
    return task.done() or started.is_set()


async def _prepare_and_run(target: TargetAdapter, job: RolloutJob, emit: Emit, prepared: asyncio.Event) -> None:
    """An inline target's `prepare(job)` (an isolated one prepares in its worker), then its rollout."""
    if job.steps > 1 and not isinstance(target, IsolatedTarget):  # inline: the steps loop runs beside the server
        from bench.steps.loop import run_steps

        await run_steps(target, job, emit, measure=False, on_prepared=prepared.set)
        return
    prepare = None if isinstance(target, IsolatedTarget) else getattr(target, "prepare", None)
    if prepare is not None:
        await asyncio.to_thread(prepare, job)
    prepared.set()
    await exits_as_errors(target.run(job, emit))  # an inline target's sys.exit must not end the bench


def _stack(task: asyncio.Task[Any]) -> str:
    buffer = io.StringIO()
    task.print_stack(file=buffer)
    print_awaited(task.get_coro(), buffer)
    return buffer.getvalue()


async def _cancel(tasks: set[asyncio.Task[Any]], timeout: float = 10.0) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


def _target(config: RunConfig) -> TargetAdapter:
    if config.isolation == "inline":
        return resolve_target(config.target)
    check_target_spec(config.target)  # a typo fails here, not after a worker started
    python = config.python or target_python(config.target)
    return IsolatedTarget(config.target, python, config.worker_log, warm=config.warm)


def _server_options(config: RunConfig) -> dict[str, Any]:
    """The server's options: the SGLang build the target declares (`engine_of`), unless the run's options name one."""
    engine = engine_of(config.target)
    return {**({"engine": engine} if engine else {}), **config.server_options}


def _loss_cause(trajectory: str, batch_error: ErrorInfo | None, hang: HangReport | None) -> ErrorInfo:
    """Why a trajectory never came back; the full traceback goes only to the trajectory that raised."""
    if batch_error is not None:
        if batch_error.trajectory == trajectory:
            return batch_error
        return ErrorInfo(batch_error.type, batch_error.message, "", batch_error.trajectory)
    if hang is not None:
        return _stall_cause(hang)
    return ErrorInfo("Missing", "the target returned no record", "")


def _batch_error(error: BaseException) -> ErrorInfo:
    if isinstance(error, TargetCrashed):
        return error.info  # the original exception, as the worker saw it
    return error_info(error)


async def run(config: RunConfig, *, show_progress: bool = False,
              while_starting: Callable[[], None] | None = None, interrupt: Interrupt | None = None) -> RunResult:
    """Run one bench scenario to the end, whatever the target does.

    `while_starting` runs on a thread while the worker imports the target (the command line loads its
    report writer there): on a framework that takes seconds to import, that time is otherwise idle.
    `interrupt` (set by a signal handler) ends the run early: the worker is killed and the result holds
    what came back until then, marked `interrupted`."""
    known = resolve_known(config.known) if config.known else None  # a bad file fails before any worker starts
    target: TargetAdapter = _target(config)
    with collector.tuned():  # the bench's CPU: fewer collections, none walking the loaded trace
        return await _run_tuned(target, config, known, show_progress, while_starting, interrupt)


async def _run_tuned(target: TargetAdapter, config: RunConfig, known: tuple[Path, list[KnownFinding]] | None,
                     show_progress: bool, while_starting: Callable[[], None] | None,
                     interrupt: Interrupt | None) -> RunResult:
    started, clock, cpu = time.time(), time.monotonic(), time.process_time()
    if isinstance(target, IsolatedTarget):
        # its imports overlap the trace loading below; the trace's path lets it skip what the trace won't need
        await target.start({"trace": str(resolve_trace(config.trace).resolve()), **config.target_options})
    side_work = _SideWork(while_starting) if while_starting else None
    # an inline target's child processes carry a marker too, so what it started is killed at the end (one variable for
    # the whole process: overlapping inline runs share it, `inline_markers`)
    inline_run = None if isinstance(target, IsolatedTarget) else inline_markers.enter()
    try:
        result = await _run_with(target, config, started, clock, side_work.cpu_s if side_work else lambda: 0.0, cpu,
                                 show_progress, interrupt)
        if known is not None:
            result.violations, result.known_violations = split(result.violations, known[1], result.target,
                                                                result.recorded_outcomes)
            result.known_file = str(known[0])
        return result
    finally:
        if side_work is not None:
            await side_work.wait()
        if isinstance(target, IsolatedTarget):
            await target.close()
        if inline_run is not None:
            await asyncio.to_thread(inline_markers.leave, inline_run)


class _SideWork:
    """Work on its own thread while the worker starts; the CPU it takes is not the bench's overhead."""

    def __init__(self, work: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._final_cpu_s: float | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name="rollout-bench side work", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - re-raised by `wait`, in the run's task
            self._error = error
        finally:
            self._final_cpu_s = time.thread_time()

    def cpu_s(self) -> float:
        if self._final_cpu_s is not None:
            return self._final_cpu_s
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident or 0))
        except (OSError, AttributeError):  # it ended meanwhile, or the platform has no per-thread clocks
            return self._final_cpu_s or 0.0

    async def wait(self) -> None:
        await asyncio.to_thread(self._thread.join)
        if self._error is not None:
            raise self._error


async def _run_with(target: TargetAdapter, config: RunConfig, started: float, clock: float,
                    side_cpu_s: Callable[[], float], cpu: float, show_progress: bool,
                    interrupt: Interrupt | None) -> RunResult:
    from bench.server import BenchServer  # after the worker's start: aiohttp's server is a few hundred ms to import

    from .watchdog import DEADLINE, HANG, ServedTurns, Stall, watch

    with collector.loading():  # the trace is in memory for the whole run: no collection walks it again
        bench_server = BenchServer(config.trace, plan=config.plan, time_scale=config.time_scale,
                                   groups_of=config.trajectories, upstream=config.upstream,
                                   tokenizer_dir=config.tokenizer_dir, **_server_options(config))
    # a run asks each turn about once: saved replies serve its retries, kept for a few hundred requests, not all of
    # them alive until a young collection walks them (`RUN_REPLY_CACHE_BYTES`)
    context = bench_server.context
    context.replies.limit_bytes = min(context.replies.limit_bytes, RUN_REPLY_CACHE_BYTES)
    context.chat_replies.limit_bytes = min(context.chat_replies.limit_bytes, RUN_REPLY_CACHE_BYTES)  # the chat route's
    context.chat_replies.parsed_limit_bytes = min(context.chat_replies.parsed_limit_bytes, RUN_REPLY_CACHE_BYTES)
    async with bench_server as server:
        store = server.context.store
        collector.freeze_loaded()  # and what starting the server made
        chosen = store.trajectories if config.trajectories is None else [
            store.by_id[t] for t in config.trajectories]
        chosen = steps.select(chosen, config.n, config.steps, str(store.path))
        specs = [_spec(t) for t in chosen]
        board = steps.start(server.context, config.plan, [s.id for s in specs], config.steps)
        server.context.identifier.dispatched = frozenset(s.id for s in specs)
        plan = config.plan
        job = RolloutJob(server.url, specs, store.header.context_length, server.context.tokenizer_folder,
                         config.concurrency,
                         plan.seed if plan else 0, [r for r in (plan.rules if plan else ()) if not r.fault.server_side],
                         {"trace": str(store.path), **config.target_options}, steps=config.steps,
                         on_step_failure=config.on_step_failure)
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

        if not isinstance(target, IsolatedTarget):
            attribution.install()  # an inline target's exceptions name the trajectory that raised them
        before = asyncio.all_tasks()
        prepared = asyncio.Event()
        task = asyncio.create_task(_prepare_and_run(target, job, emit, prepared), name=f"target {target.name}")
        deadline = clock + config.deadline_s
        startup_limit = min(config.startup_s, max(0.0, deadline - time.monotonic()))
        started_in_time = await _started(task, target, startup_limit, prepared, interrupt)
        server.context.faults.start_clock()  # `server_start` windows count from here (the rest: the first request)
        served = ServedTurns(server.log, store)

        def progress() -> tuple[int, int]:
            """Finished work (samples emitted, recorded turns answered), and the generate requests received."""
            turns, requests = served.update()
            return len(records) + turns, requests

        if interrupt is not None and interrupt.is_set:
            stall: Stall | None = Stall(INTERRUPTED, 0.0, 0)
        elif started_in_time:
            stall = await watch(task, progress, config.watchdog_s, deadline, interrupt)
        else:
            stall = Stall(DEADLINE if startup_limit < config.startup_s else HANG, startup_limit, 0)
        interrupted = interrupt.reason if stall is not None and stall.kind == INTERRUPTED and interrupt else None
        hung = stall is not None
        idle_s = config.watchdog_s if started_in_time else config.startup_s
        returned_at = None if hung else time.time()
        accepting = False
        if board is not None:
            board.close()  # a step that ends from now on is not the run's: its records are not taken either
        bar.close()
        hang = batch_error = None
        if interrupted:
            pass  # not the target's doing: no stacks, no liveness verdict
        elif stall is not None:
            if isinstance(target, IsolatedTarget):
                stacks = await target.dump_stacks()
            else:
                stacks = [_stack(t) for t in asyncio.all_tasks() - before
                          if not t.done() and t is not asyncio.current_task()]
            hang = HangReport(stall.idle_s if stall.kind == DEADLINE else idle_s, stacks, stall.kind,
                              stall.requests_in_window, round(stall.idle_s, 3),
                              config.deadline_s if stall.kind == DEADLINE else None)
        elif isinstance(task.exception(), TargetStartError):
            raise task.exception()  # type: ignore[misc]
        elif task.exception() is not None:
            batch_error = _batch_error(task.exception())  # type: ignore[arg-type]
        if board is not None and batch_error is None and not interrupted and (failed := board.first_error()):
            batch_error = failed[1]  # the first step that raised (each step's own error is on the board)
        if hung:
            await _cancel({task})  # an isolated target's worker is killed, group and all
        orphans = {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}
        await _cancel(orphans)
        isolated = target if isinstance(target, IsolatedTarget) else None
        returned = set(records)
        dispatched = steps.ran_ids(board, [s.id for s in specs])
        specs = [s for s in specs if s.id in dispatched]  # steps after a stop never ran: none of theirs is lost
        for spec in specs:
            if spec.id not in records:
                cause = ErrorInfo("Interrupted", f"the bench got {interrupted} before this trajectory came back", "") \
                    if interrupted else steps.loss_cause(board, spec.id, hang and _stall_cause(hang)) if board \
                    else _loss_cause(spec.id, batch_error, hang)
                records[spec.id] = SampleRecord(spec.id, spec.group, "lost", error=cause,
                                                prompt_length=len(spec.prompt_ids))
        duration = time.monotonic() - clock
        ordered = [records[s.id] for s in specs]
        requests = list(server.log.records)
        events = with_reach(list(server.context.faults.log.events), requests, ordered, batch_error,
                            server.context.faults.consumed, server.context.tokenizer)
        tokenizer = server.context.tokenizer
        framework = framework_info_of(target)
        config = replace(config, bounds=declared_bounds(config.bounds, framework))
        step_violations, step_table = steps.finish(board, ordered, requests, events, config.on_step_failure,
                                                   config.bounds.max_weight_lag) if board is not None else ([], None)
        if board is not None and not interrupted:  # a failure after a failed step: rerun it in a fresh process
            step_violations = await steps.confirm_in_fresh_process(config, board, step_violations)
            if config.compare_fresh and step_table is not None:  # opt-in: a worker more, for one step
                step_violations += await steps.compare_with_fresh_process(config, board, ordered, step_table)
        view = RunView(ordered, requests, events, steps.view_plan(board, plan),
                       {s.id: s.group for s in specs}, store.header.context_length, target.fail_fast,
                       batch_error, hang, duration, config.bounds, emitted, server.context.served,
                       tokens_source_of(target), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       upstream=config.upstream)
        violations = check_all(view, config.invariants) + step_violations
        if step_table is not None and board is not None:
            step_table["first_violation"] = steps.first_violation(board, violations)
        judged = [v for v in violations if v.trajectory in returned] if interrupted else violations
        return RunResult(config, target.name, str(store.path), store.header.context_length, ordered,
                         view.requests, view.fault_events, judged, batch_error, hang, started, duration,
                         isolated.leaked_tasks if isolated else len(orphans), config.isolation,
                         isolated.describe() if isolated else None, time.process_time() - cpu - side_cpu_s(),
                         isolated.returned_at if isolated else returned_at,
                         recorded_outcomes={t.id: t.recorded_outcome for t in chosen}, served=view.served,
                         provenance={t: a.label for t, a in provenance.assess(view).items()},
                         tokens_source=view.tokens_source, framework=framework,
                         worker_log=isolated.log_text() if isolated else None, interrupted=interrupted,
                         violations_not_judged=len(violations) - len(judged), steps=step_table,
                         server=server.context.config.played())


RUN_REPLY_CACHE_BYTES = 2**20  # a run's saved replies (`native_fast.ReplyCache`): its retries come soon after


def declared_bounds(bounds: Bounds, framework: dict[str, str] | None) -> Bounds:
    """The run's bounds, widened to the staleness a framework declares it accepts by configuration
    (`max_weight_lag` in its `framework_info()`, e.g. open-instruct's `async_steps`): training on what the
    framework was configured to allow is not a finding. A stricter declaration narrows only the bench's default
    bound (AReaL's synchronous default, 0: a sample one version behind is its bug), never a wider one the run was
    given (an explicit bound equal to the default counts as the default)."""
    declared = (framework or {}).get("max_weight_lag", "")
    if not declared.isdigit():
        return bounds
    wanted, default = int(declared), Bounds().max_weight_lag
    if wanted > bounds.max_weight_lag or (wanted < default and bounds.max_weight_lag == default):
        return replace(bounds, max_weight_lag=wanted)
    return bounds


def _stall_cause(hang: HangReport) -> ErrorInfo:
    """What a trajectory lost to a stall is marked with."""
    if hang.kind == "livelock":
        return ErrorInfo("Livelock", f"requests flowed but nothing finished for {hang.idle_s:g} s", "")
    if hang.kind == "deadline":
        return ErrorInfo("Deadline", f"the run reached its {hang.deadline_s:g} s deadline", "")
    return ErrorInfo("Hang", f"no progress for {hang.idle_s:g} s", "")


def run_blocking(config: RunConfig) -> RunResult:
    """`run` from synchronous code, also when an event loop already runs in this thread (an async test)."""
    import concurrent.futures

    try:
        asyncio.get_running_loop()
        in_a_loop = True
    except RuntimeError:
        in_a_loop = False
    if not in_a_loop:  # outside the `except`: the run's own exceptions must not chain to this RuntimeError
        return asyncio.run(run(config))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run(config)).result()
