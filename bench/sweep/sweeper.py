"""`rollout-bench sweep`: a grid of runs (plans × targets × fault rates × seeds), one process each.

Every grid point is a `rollout-bench run` subprocess in its own session, writing its own report
folder (`DIR/runs/<id>/`, with the `plan.toml` it ran and its output in `run.log`). A run that
crashes, or hangs past `timeout_s` (killed with everything it started), is a row in the table
with outcome `crashed` / `timeout`, never a lost sweep. The table (`DIR/sweep.csv`, see
`table`) is rewritten after every run, so an interrupted sweep keeps what it finished.
What a fault rate does to a plan is `grid`'s docstring.

An interrupted sweep (SIGINT, SIGTERM) sends its runs SIGTERM, so each writes the report of what it
gathered, marked interrupted; after `STOP_GRACE_S` whatever still runs is killed with its children, and
`sweep.json` says `interrupted`. A sweep killed outright (SIGKILL) takes its runs along too: each run's
stdin is a pipe only the sweep holds (`ROLLOUT_BENCH_STDIN_LIFELINE`), and a run whose stdin reaches end
of file kills its process group, its workers following through their own lifelines. Every process a
sweep starts carries the sweep's marker in its environment (`bench.isolation.escapees`), and the sweep
kills whatever still carries it when it ends.

Where runs run is the executor's business: `LocalExecutor` (here, `jobs` subprocesses at a time) or
`ray_executor.RayExecutor` (`--ray`: one Ray task per run, on the cluster's nodes); both hand each run's
rows to `run_sweep`, which owns the tables, `sweep.json` and the ledger `--resume` reads (`resume`).
`--shard K/N` picks part of the grid before either executor sees it (`grid.Shard`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from bench import __version__
from bench.invariants import INVARIANTS
from bench.records.atomic_write import write_text
from bench.isolation.escapees import SWEEP_MARKER, descendants, kill_marked, new_marker
from bench.trace.shipped import DEFAULT_TRACE, resolve_trace
from faults import Plan

from .grid import (GridPoint, Shard, SweepError, build_grid, parse_plans, parse_rates, parse_seeds, parse_shard,
                   parse_targets, write_plan)
from .resume import (RERUN_OUTCOMES, RowLedger, grid_record, read_record, refuse, resumed_grid,
                     resumed_options)
from .liveness import existing_sweep_note
from .table import RUN_OUTCOMES, Finished, run_rows, write_sweep_tables


def default_jobs() -> int:
    """The cores this process may use (its CPU affinity where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class SweepOptions:
    """How each run of the grid is run (the same for all of them)."""

    trace: str = DEFAULT_TRACE
    n: int | None = None
    time_scale: float = 0.05
    concurrency: int = 64
    watchdog_s: float = 30.0
    timeout_s: float = 600.0  # per run: past it, the run and its children are killed
    jobs: int = field(default_factory=default_jobs)
    invariants: tuple[str, ...] | None = None  # None: all of them
    steps: int = 1  # training steps per run (`run --steps K`): the rollout called K times in one worker
    on_step_failure: str = "stop"
    compare_fresh: bool = False  # `run --compare-fresh`: each run reruns its last clean step in a fresh worker
    run_args: tuple[str, ...] = ()  # more `rollout-bench run` options, passed as they are

    def check(self) -> None:
        if self.jobs < 1:
            raise SweepError(f"--jobs {self.jobs}: needs at least 1")
        if self.timeout_s <= 0:
            raise SweepError(f"--timeout {self.timeout_s:g}: needs a positive number of seconds")
        if self.n is not None and self.n < 1:
            raise SweepError(f"--n {self.n}: needs at least 1 trajectory")
        if self.concurrency < 1:
            raise SweepError(f"--concurrency {self.concurrency}: needs at least 1")
        if self.steps < 1:
            raise SweepError(f"--steps {self.steps}: needs at least 1")
        if self.on_step_failure not in ("stop", "continue"):
            raise SweepError(f"--on-step-failure {self.on_step_failure!r}: stop or continue")
        if self.compare_fresh and self.steps < 2:
            raise SweepError("--compare-fresh needs --steps 2 or more: it compares a later step with a fresh process")
        if not math.isfinite(self.watchdog_s) or self.watchdog_s <= 0:
            raise SweepError(f"--watchdog {self.watchdog_s:g}: needs a positive number of seconds")
        if not math.isfinite(self.timeout_s) or not math.isfinite(self.time_scale) or self.time_scale < 0:
            raise SweepError(f"--timeout {self.timeout_s:g} / --time-scale {self.time_scale:g}: need finite numbers, "
                             "the time scale 0 or more")
        unknown = [name for name in self.invariants or () if name not in INVARIANTS]
        if unknown or self.invariants == ():
            raise SweepError(f"--invariants {','.join(self.invariants or ())!r}: unknown or none "
                             f"({', '.join(unknown)}); valid: {', '.join(INVARIANTS)}")


def sweep_invariants(spec: str | None) -> tuple[str, ...]:
    """`--invariants`; by default all but vacuity: at a low rate a rule that never fired is data (the
    `fault_events` column), not a finding against the target."""
    if spec is None:
        return tuple(name for name in INVARIANTS if name != "vacuity")
    return tuple(name.strip() for name in spec.split(",") if name.strip())


def run_command(point: GridPoint, plan_file: Path, folder: Path, options: SweepOptions) -> list[str]:
    """The `rollout-bench run` command line of one grid point (this interpreter, `-m bench`)."""
    command = [sys.executable, "-m", "bench", "run", "--trace", options.trace, "--plan", str(plan_file),
               "--seed", str(point.seed), "--target", point.target, "--time-scale", f"{options.time_scale:g}",
               "--concurrency", str(options.concurrency), "--watchdog", f"{options.watchdog_s:g}",
               "--out", str(folder), "--force",  # the run's folder already holds its plan.toml and run.log
               "--repro-reruns", "1"]  # a grid of failing runs: verify, do not shrink
    if options.n is not None:
        command += ["--n", str(options.n)]
    if options.invariants is not None:
        command += ["--invariants", ",".join(options.invariants)]
    if options.steps > 1:
        command += ["--steps", str(options.steps), "--on-step-failure", options.on_step_failure]
    if options.compare_fresh:
        command.append("--compare-fresh")
    return command + list(options.run_args)


def kill_tree(pid: int) -> None:
    """SIGKILL a run's session and every process below it, including workers in sessions of their own."""
    below = descendants(pid)
    own = os.getpgid(0)
    for target in [pid, *below]:
        try:
            group = os.getpgid(target)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _log_tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - 4096))
            lines = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line), "")


STDIN_LIFELINE = "ROLLOUT_BENCH_STDIN_LIFELINE"  # `run` watches its stdin: end of file = the sweep is gone
STOP_GRACE_S = 3.0  # an interrupted sweep's runs get this long to write their interrupted reports


class _Processes:
    """The runs in flight, so an interrupted sweep can end them (they do not get the terminal's Ctrl-C)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.marker = new_marker()

    def start(self, command: list[str], log: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self.stopping:
                raise KeyboardInterrupt
            env = {**os.environ, "PYTHONUNBUFFERED": "1", STDIN_LIFELINE: "1", SWEEP_MARKER: self.marker}
            # stdin: a pipe nobody writes to; only this process holds its write end, so the run sees end of
            # file the moment the sweep ends, however it ends
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=env)
            self._live[process.pid] = process
            return process

    def done(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._live.pop(process.pid, None)
        if process.stdin is not None:
            process.stdin.close()

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every run (each writes an interrupted report), then kill what is left after `grace_s`."""
        with self._lock:
            self.stopping = True
            live = list(self._live.values())
        for process in live:
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()

    def kill_all(self) -> None:
        with self._lock:
            self.stopping = True
            for pid in list(self._live):
                kill_tree(pid)
        kill_marked(SWEEP_MARKER, self.marker)


def run_point(point: GridPoint, out: Path, options: SweepOptions, processes: _Processes,
              say: Callable[[str], None] = print) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one grid point to its end (finished, crashed or killed at the timeout); its table rows."""
    folder = out / "runs" / point.id
    plan_file = write_plan(point.plan, folder / "plan.toml")
    say(f"sweep: run {point.id}: {_describe(point)}")
    clock = time.monotonic()
    with (folder / "run.log").open("wb") as log:
        process = processes.start(run_command(point, plan_file, folder, options), log)
        timed_out = False
        try:
            process.wait(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(process.pid)
            process.wait()
        finally:
            processes.done(process)
    finished = Finished(None if timed_out else process.returncode, timed_out, time.monotonic() - clock,
                        _log_tail(folder / "run.log"))
    base = {"run": point.id, "plan": point.plan_name, "target": point.target, "rate": float(point.rate),
            "seed": point.seed, "n": options.n, "trace": options.trace}
    return run_rows(base, folder, finished)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SweepError(f"--out {out}: exists and is not an empty folder; give a new one "
                         f"(a sweep never mixes its runs with an older sweep's){existing_sweep_note(out)}")


_SAY = threading.Lock()


def _say(bar: tqdm | None, line: str) -> None:
    """One whole line on stderr (runs finish on several threads), above the progress bar if there is one."""
    with _SAY:
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


def _describe(point: GridPoint) -> str:
    return f"plan={point.plan_name} target={point.target} rate={point.rate} ({float(point.rate):g}) seed={point.seed}"


def _finish_line(done: int, total: int, point: GridPoint, row: dict[str, Any]) -> str:
    drop = "" if row["drop_rate"] is None else f", drop rate {row['drop_rate']:.2%}"
    why = f" ({row['error']})" if row["error"] else ""
    code = "" if row["exit_code"] is None else f", exit {row['exit_code']}"
    return (f"sweep: [{done}/{total}] {point.id}: {row['outcome']}{why}{code}{drop}, {row['wall_s']:.1f} s, "
            f"seed {point.seed}")


Rows = tuple[dict[str, Any], list[dict[str, Any]]]  # a run's row of sweep.csv and its rows of sweep_faults.csv
Finish = Callable[[GridPoint, Rows], None]


class LocalExecutor:
    """Runs on this machine: `options.jobs` subprocesses at a time (`run_point` on a thread each)."""

    name = "local"

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name}

    def run(self, points: list[GridPoint], out: Path, options: SweepOptions, finish: Finish,
            say: Callable[[str], None]) -> None:
        processes = _Processes()
        run_pool(points, options.jobs, "sweep", lambda point: run_point(point, out, options, processes, say), finish,
                 stop=processes.stop_all)
        kill_marked(SWEEP_MARKER, processes.marker)  # anything a finished run left behind


def run_pool(points: list[GridPoint], jobs: int, name: str, work: Callable[[GridPoint], Any], finish: Finish,
             stop: Callable[[], None]) -> None:
    """Every point through `work`, `jobs` at a time on threads, each result to `finish` as it ends (both executors).
    On any exception (Ctrl-C, a SIGTERM raised as one) `stop` ends what runs; the runs that ended meanwhile (their
    interrupted reports) still get their rows, then the exception goes on."""
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=name)
    pending: dict[Future[Any], GridPoint] = {}
    try:
        for point in points:
            pending[pool.submit(work, point)] = point
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                finish(pending.pop(future), future.result())
    except BaseException:
        stop()
        pool.shutdown(wait=True, cancel_futures=True)
        for future, point in pending.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                finish(point, future.result())
        raise
    pool.shutdown()


def _write_atomic(path: Path, text: str) -> None:
    """Written whole, then renamed (`atomic_write`): a sweep killed meanwhile leaves the previous version, never half
    a file; a full disk is a `WriteError` naming the file."""
    write_text(path, text)


def run_sweep(plans: list[Plan], targets: list[str], rates: list[Fraction], seeds: list[int], out: str | Path,
              options: SweepOptions, *, show_progress: bool = False, shard: Shard | None = None,
              resume: bool = False, executor: Any = None) -> list[dict[str, Any]]:
    """Run the grid (or its `shard`), `options.jobs` runs at a time; returns the rows of `sweep.csv`, in grid
    order. `resume`: `out` holds this sweep already (the caller checked its record): keep the rows of its
    finished runs and run the rest. `executor`: where runs run (default `LocalExecutor`; `RayExecutor`)."""
    options.check()
    out = Path(out)
    executor = executor or LocalExecutor()
    points = build_grid(plans, targets, rates, seeds)
    if shard is not None:
        points = shard.select(points)
    ledger = RowLedger(out)
    rows: dict[int, dict[str, Any]] = {}
    fault_rows: dict[int, list[dict[str, Any]]] = {}
    if resume:
        indexes = {point.index for point in points}
        for index, (row, faults) in ledger.finished().items():
            if index in indexes and row["outcome"] not in RERUN_OUTCOMES:
                rows[index], fault_rows[index] = row, faults
    else:
        _check_out(out)
    todo = [point for point in points if point.index not in rows]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for point in todo:  # a resumed sweep's unfinished runs start from nothing (a killed run left part of a report)
        shutil.rmtree(out / "runs" / point.id, ignore_errors=True)
    settings = {**asdict(options), "run_args": list(options.run_args),
                "invariants": None if options.invariants is None else list(options.invariants)}
    config = {"version": __version__, "plans": [p.name for p in plans], "plan_sources": [p.source for p in plans],
              "targets": targets, "rates": [float(r) for r in rates], "seeds": seeds, "runs": len(points),
              "shard": None if shard is None else str(shard), "options": settings, **executor.describe(),
              "grid": grid_record(plans, targets, rates, seeds, shard, settings),
              "resumed_with_finished_runs": len(rows) if resume else None, "started": time.time(),
              # while `status` is running: a sweep killed outright (SIGKILL) cannot mark itself, so `report` checks
              # whether this process still exists
              "pid": os.getpid(), "host": os.uname().nodename}
    clock = time.monotonic()
    bar = tqdm(total=len(points), initial=len(rows), desc="sweep", unit="run", file=sys.stderr) \
        if show_progress and sys.stderr.isatty() else None

    def save(status: str) -> None:
        ordered = sorted(rows)
        write_sweep_tables([rows[i] for i in ordered], [f for i in ordered for f in fault_rows[i]], out)
        outcomes = {name: sum(1 for r in rows.values() if r["outcome"] == name) for name in RUN_OUTCOMES}
        summary = {**config, "status": status, "finished_runs": len(rows), "outcomes": outcomes,
                   "duration_s": round(time.monotonic() - clock, 3)}
        _write_atomic(out / "sweep.json", json.dumps(summary, indent=2) + "\n")

    def finish(point: GridPoint, result: Rows) -> None:
        rows[point.index], fault_rows[point.index] = result
        ledger.append(point.index, *result)  # first: what the ledger holds is what a resume keeps
        if bar is not None:
            bar.update(1)
        _say(bar, _finish_line(len(rows), len(points), point, rows[point.index]))
        save("running")

    if resume:
        _say(bar, f"sweep: resuming {out}: {len(rows)} of {len(points)} runs finished, {len(todo)} to run")
    save("running")
    try:
        executor.run(todo, out, options, finish, lambda line: _say(bar, line))
    except BaseException:
        save("interrupted")
        raise
    finally:
        if bar is not None:
            bar.close()
    save("finished")
    return [rows[i] for i in sorted(rows)]


# SweepOptions fields as the command line names them (for a resume refused over a difference)
OPTION_NAMES = {"trace": "--trace", "n": "--n", "time_scale": "--time-scale", "concurrency": "--concurrency",
                "watchdog_s": "--watchdog", "timeout_s": "--timeout", "invariants": "--invariants",
                "steps": "--steps", "on_step_failure": "--on-step-failure", "compare_fresh": "--compare-fresh",
                "run_args": "--python/--in-process/--known"}


def sweep_command(plan: str | None, target: str | None, rates: str | None, seeds: str | None, out: str,
                  options: SweepOptions, *, shard: str | None = None, resume: bool = False,
                  given: frozenset[str] = frozenset(), ray_address: str | None = None) -> int:
    """The `rollout-bench sweep` command: 0 when every run is ok, 1 when any found violations,
    crashed or timed out (the table is written either way), 2 for bad options (raised).
    `resume`: `out` is a sweep to finish; grid options left None and options not in `given` (SweepOptions
    field names this command set) come from its record, the others must equal it."""
    if not resume:
        missing = [name for name, value in (("--plan", plan), ("--target", target), ("--rates", rates),
                                             ("--seeds", seeds)) if value is None]
        if missing:
            raise SweepError(f"{', '.join(missing)}: required (or --resume DIR to finish a sweep)")
    grid_plans = None if plan is None else parse_plans(plan)
    grid_targets = None if target is None else parse_targets(target)
    grid_rates = None if rates is None else parse_rates(rates)
    grid_seeds = None if seeds is None else parse_seeds(seeds)
    grid_shard = None if shard is None else parse_shard(shard)
    if resume:
        record = read_record(Path(out))
        kept, grid_differences = resumed_grid(Path(out), record, grid_plans, grid_targets, grid_rates, grid_seeds,
                                              grid_shard)
        grid_plans, grid_targets, grid_rates, grid_seeds, grid_shard = \
            kept.plans, kept.targets, kept.rates, kept.seeds, kept.shard
        settings, option_differences = resumed_options(Path(out), record,
                                                       {name: getattr(options, name) for name in given},
                                                       OPTION_NAMES, {"jobs": options.jobs})
        refuse(Path(out), grid_differences + option_differences)
        options = SweepOptions(**{**settings, "run_args": tuple(settings["run_args"]),
                                  "invariants": None if settings["invariants"] is None
                                  else tuple(settings["invariants"])})
    assert grid_plans is not None and grid_targets is not None and grid_rates is not None and grid_seeds is not None
    options.check()
    try:
        resolve_trace(options.trace)
    except (FileNotFoundError, KeyError) as error:
        raise SweepError(f"--trace: {error.args[0] if error.args else error}") from None
    executor = None
    if ray_address is not None:
        from .ray_executor import RayExecutor

        executor = RayExecutor.connect(ray_address, grid_targets, options)
        if "jobs" not in given:  # as many at once as the cluster has CPUs
            options = dataclasses.replace(options, jobs=executor.cpus)
    total = len(grid_plans) * len(grid_targets) * len(grid_rates) * len(grid_seeds)
    part = "" if grid_shard is None else f", shard {grid_shard}: {len(range(grid_shard.k - 1, total, grid_shard.n))} of them"
    print(f"sweep: {total} runs{part} ({len(grid_plans)} plans x {len(grid_targets)} targets x {len(grid_rates)} "
          f"rates x {len(grid_seeds)} seeds), {options.jobs} at a time"
          f"{'' if executor is None else ' on the Ray cluster'}, timeout {options.timeout_s:g} s each; "
          f"seeds {','.join(map(str, grid_seeds))}", file=sys.stderr)
    rows = run_sweep(grid_plans, grid_targets, grid_rates, grid_seeds, out, options, show_progress=True,
                     shard=grid_shard, resume=resume, executor=executor)
    counts = {name: sum(1 for r in rows if r["outcome"] == name) for name in RUN_OUTCOMES}
    print("sweep: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    print(f"table: {(Path(out) / 'sweep.csv').resolve()}")
    return 0 if counts["ok"] == len(rows) else 1
