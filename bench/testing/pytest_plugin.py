"""pytest plugin for rollout-bench: fixtures, markers and options for bench tests in a team's suite.

Registered through the `pytest11` entry point (`rollout_bench`), so pytest loads it in
every session of an environment where rollout-bench is installed. At import it therefore
needs only pytest and the standard library: the bench itself (server, runner, reports) is
imported by the fixtures, when a test first asks for one. `-p no:rollout_bench` turns it off.

Fixtures:
- `bench_plan`: the test's fault plan (`@pytest.mark.bench_plan(...)`, else `--bench-plan`),
  with `--bench-seed` (or the marker's `seed=`) applied; None means no faults.
- `bench_trace`: the test's trace (`@pytest.mark.bench_trace(...)`, default agentic-500).
- `bench_server`: the mock server on 127.0.0.1 in a thread, with that trace and plan: its
  URL, the request log, the fault log and the trace's trajectories (prompts to send).
- `bench_run`: a function `bench_run(target, **options) -> BenchResult` that runs a target
  under the plan (`bench.orchestration.runner.run`), writes the report folder and, on violations, the
  repro file.
A failing test that used them gets a `rollout-bench` report section: the seed, each
violated invariant with its evidence, and the repro file with the command that reruns it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from bench.orchestration.runner import RunResult
    from bench.server import ServerThread
    from bench.targets import TrajectorySpec
    from faults import FaultEvent, Plan

DEFAULT_TRACE = "agentic-500"  # bench.trace.shipped.DEFAULT_TRACE, repeated to keep this module import-free
PROFILE_ENV = "ROLLOUT_BENCH_HYPOTHESIS_PROFILE"  # bench.testing.hypothesis_profiles.PROFILE_ENV
EVIDENCE_CHARS = 800  # per violation in the failure section; the report folder has all of it

_RESULTS = pytest.StashKey[list["BenchResult"]]()
_SERVERS = pytest.StashKey[list["BenchServerHandle"]]()
_SESSION = pytest.StashKey["_Session"]()
_UNSET: Any = object()


# --- options, markers, profile --------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rollout-bench", "rollout-bench fault-injection runs")
    group.addoption("--bench-seed", type=int, default=None, metavar="SEED",
                    help="fault plan seed for every bench run (overrides plan files; a marker's seed= wins)")
    group.addoption("--bench-plan", default=None, metavar="PLAN",
                    help="fault plan (shipped name or TOML file) for bench tests without a bench_plan marker")
    group.addoption("--bench-report-dir", default=None, metavar="DIR",
                    help="write each bench run's report folder under DIR/<test>/<target> "
                         "(default: pytest's temporary directory)")
    parser.addini("bench_hypothesis_profile", default="",
                  help=f"Hypothesis profile to load (pr, nightly or a registered name); ${PROFILE_ENV} overrides")


@dataclass
class _Session:
    report_root: Path | None
    used: set[Path] = field(default_factory=set)
    runs: int = 0
    failed_runs: int = 0
    profile: str | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "bench_plan(plan, *, seed=None): fault plan for the bench fixtures (shipped name, TOML path "
                   "relative to the test file or cwd, a faults.Plan, or None for no faults)")
    config.addinivalue_line("markers", "bench_trace(trace): trace for the bench fixtures (shipped name or file)")
    root = config.getoption("bench_report_dir", None)
    session = _Session(Path(root).resolve() if root else None)
    config.stash[_SESSION] = session
    session.profile = _choose_hypothesis_profile(config)


def _choose_hypothesis_profile(config: pytest.Config) -> str | None:
    """Load our Hypothesis profile when one is asked for (Hypothesis' `ci` default is replaced)."""
    requested = os.environ.get(PROFILE_ENV) or config.getini("bench_hypothesis_profile")
    on_command_line = config.getoption("hypothesis_profile", None)  # Hypothesis' own option, when present
    if not requested and not (on_command_line or "").startswith("rollout-bench"):
        return None  # nothing asked: hypothesis is not even imported
    try:
        from . import hypothesis_profiles
    except ImportError as error:
        raise pytest.UsageError(f"rollout-bench: a Hypothesis profile was requested ({requested or on_command_line})"
                                f" but hypothesis is not installed: {error}") from None
    if on_command_line:  # Hypothesis' plugin loads it after us; ours only need registering
        hypothesis_profiles.register_profiles()
        return str(on_command_line)
    try:
        return hypothesis_profiles.load_profile(requested)
    except ValueError as error:
        raise pytest.UsageError(f"rollout-bench: {error}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(_SESSION, None)
    parts = [f"{name}={config.getoption(dest)}" for name, dest in
             (("plan", "bench_plan"), ("seed", "bench_seed"), ("reports", "bench_report_dir"))
             if config.getoption(dest, None) is not None]
    if session is not None and session.profile:
        parts.append(f"hypothesis profile={session.profile}")
    return [f"rollout-bench: {', '.join(parts)}"] if parts else []


# --- what the fixtures hand out ---------------------------------------------------------------

@dataclass(repr=False)
class BenchResult:
    """One bench run: its records, violations, logs, and where its report and repro file are."""

    run: "RunResult"
    report_dir: Path
    repro_path: Path | None
    summary: dict[str, Any]

    def __repr__(self) -> str:  # short: pytest prints it in every failed assertion about a result
        plan = self.plan.name if self.plan else None
        return (f"<BenchResult {self.target} plan={plan} seed={self.seed} "
                f"violated={sorted(self.violated)} report={self.report_dir}>")

    @property
    def records(self) -> list[Any]:
        return self.run.records

    @property
    def violations(self) -> list[Any]:
        return self.run.violations

    @property
    def violated(self) -> set[str]:
        """Names of the violated invariants."""
        return {v.invariant for v in self.run.violations}

    @property
    def ok(self) -> bool:
        return not self.run.violations

    @property
    def known_violations(self) -> list[Any]:
        """Violations the run's known findings (`known=`) declared: reported, not failures."""
        return self.run.known_violations

    @property
    def outcomes(self) -> dict[str, int]:
        """Trajectories per outcome (completed, truncated, aborted, dropped, failed, lost)."""
        counts: dict[str, int] = {}
        for record in self.run.records:
            counts[record.outcome] = counts.get(record.outcome, 0) + 1
        return counts

    @property
    def fault_events(self) -> list["FaultEvent"]:
        return self.run.fault_events

    @property
    def requests(self) -> list[Any]:
        return self.run.requests

    @property
    def batch_error(self) -> Any:
        return self.run.batch_error

    @property
    def plan(self) -> "Plan | None":
        return self.run.config.plan

    @property
    def seed(self) -> int | None:
        return self.plan.seed if self.plan else None

    @property
    def target(self) -> str:
        return self.run.target

    def explain(self) -> str:
        """The seed, each violation with its evidence, the report folder and the repro file."""
        plan = self.plan
        lines = [f"{self.target} on {self.run.config.trace}: plan {plan.name if plan else None}, seed {self.seed}, "
                 f"{len(self.records)} trajectories ({_counts(self.outcomes)})"]
        if self.batch_error is not None:
            from bench.invariants.root_cause import root_cause

            cause = root_cause(self.batch_error, self.fault_events)
            lines.append(f"  batch error: {cause.explain()}")
            if cause.error.traceback:
                lines.append("  traceback:\n" + "\n".join(f"    {line}" for line in
                                                           cause.error.traceback.rstrip().splitlines()))
        if not self.violations:
            lines.append("  no violations")
        for number, violation in enumerate(self.violations, start=1):
            lines.append(f"  violation {number}/{len(self.violations)}: {violation.invariant} "
                         f"[{violation.trajectory or 'run'}] {violation.message}")
            shown = {k: v for k, v in violation.evidence.items() if k != "traceback"}  # printed whole above
            evidence = json.dumps(shown, default=str, sort_keys=True)
            lines.append(f"    evidence: {_clip(evidence)}")
            if violation.fault:
                fault = violation.fault
                lines.append(f"    after fault: {fault.get('fault')} (rule {fault.get('rule')}) on "
                             f"{fault.get('trajectory')} turn {fault.get('turn')} attempt {fault.get('attempt')}")
        if self.known_violations:
            lines.append(f"  known violations (not failures): {len(self.known_violations)}, declared in "
                         f"{self.run.known_file}")
        lines.append(f"  report: {self.report_dir}")
        if self.repro_path is not None:
            lines.append(f"  repro: {self.repro_path}")
            lines.append(f"  rerun: rollout-bench run --repro {self.repro_path}")
        return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items())) or "none"


def _clip(text: str) -> str:
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + f"... ({len(text)} chars)"


def assert_no_violations(result: BenchResult) -> None:
    """AssertionError carrying `result.explain()` when the run violated any invariant."""
    if not result.ok:
        raise AssertionError(f"{result.target} violated {', '.join(sorted(result.violated))}\n{result.explain()}")


@dataclass
class BenchServerHandle:
    """The running mock server: where it is and what it logged."""

    thread: "ServerThread"
    trace: str
    plan: "Plan | None"

    @property
    def url(self) -> str:
        return self.thread.url

    @property
    def seed(self) -> int | None:
        return self.plan.seed if self.plan else None

    @property
    def requests(self) -> list[Any]:
        """The request log so far (`bench.records.request_log.RequestRecord`s)."""
        return list(self.thread.context.log.records)

    @property
    def fault_events(self) -> list["FaultEvent"]:
        """Every fault that fired so far, with its rule, trajectory, turn and attempt."""
        return list(self.thread.context.faults.log.events)

    @property
    def request_log(self) -> Any:
        return self.thread.context.log

    @property
    def fault_log(self) -> Any:
        return self.thread.context.faults.log

    @property
    def context_length(self) -> int:
        return self.thread.context.config.context_length

    @property
    def trajectories(self) -> list["TrajectorySpec"]:
        """The trace's trajectories as a target receives them: ids, groups, prompt ids and text, sampling params."""
        from bench.targets import TrajectorySpec

        return [TrajectorySpec(t.id, t.group_id, _ints(t.sequences[0], t.prompt_len), t.prompt_text,
                               t.prompt_messages, t.prompt_tools, dict(t.first_sampling_params), len(t.turns),
                               t.prompt_raw)
                for t in self.thread.context.store.trajectories]

    def explain(self) -> str:
        events = self.fault_events
        lines = [f"bench server {self.url} on {self.trace}: plan {self.plan.name if self.plan else None}, "
                 f"seed {self.seed}, {len(self.requests)} requests, {len(events)} fault events"]
        lines += [f"  fault: {e.fault} (rule {e.rule}) on {e.trajectory} turn {e.turn} attempt {e.attempt}: {e.change}"
                  for e in events[:20]]
        if len(events) > 20:
            lines.append(f"  ... {len(events) - 20} more")
        return "\n".join(lines)


def _ints(packed: Any, count: int) -> list[int]:
    """The first `count` ids of a packed sequence (int32 bytes, as the replay store keeps them)."""
    from array import array

    return list(array("i", packed[: count * 4]))


# --- fixtures -------------------------------------------------------------------------------

def _resolve_plan(spec: Any, seed: int | None, test_path: Path | None) -> "Plan | None":
    from faults import Plan, load_plan, resolve_plan

    if spec is None:
        return None
    if isinstance(spec, Plan):
        plan = spec
    elif isinstance(spec, (str, os.PathLike)):
        beside = test_path.parent / spec if test_path is not None else None
        plan = load_plan(beside) if beside is not None and beside.is_file() else resolve_plan(str(spec))
    else:
        raise pytest.UsageError(f"bench_plan: expected a plan name, a TOML path or a faults.Plan, got {spec!r}")
    return plan.with_seed(seed) if seed is not None else plan


@pytest.fixture
def bench_plan(request: pytest.FixtureRequest) -> "Plan | None":
    """The test's fault plan: its `bench_plan` marker, else `--bench-plan`; `--bench-seed` applied."""
    seed = request.config.getoption("bench_seed")
    marker = request.node.get_closest_marker("bench_plan")
    if marker is not None:
        spec = marker.args[0] if marker.args else marker.kwargs.get("plan")
        seed = marker.kwargs.get("seed", seed)
    else:
        spec = request.config.getoption("bench_plan")
    return _resolve_plan(spec, seed, Path(str(request.node.path)) if hasattr(request.node, "path") else None)


@pytest.fixture
def bench_trace(request: pytest.FixtureRequest) -> str:
    """The test's trace: its `bench_trace` marker, else the shipped agentic-500."""
    marker = request.node.get_closest_marker("bench_trace")
    if marker is None or not marker.args:
        return DEFAULT_TRACE
    trace = str(marker.args[0])
    beside = Path(str(request.node.path)).parent / trace
    return str(beside) if beside.is_file() else trace


@pytest.fixture
def bench_server(request: pytest.FixtureRequest, bench_plan: "Plan | None",
                 bench_trace: str) -> Iterator[BenchServerHandle]:
    """The mock server on 127.0.0.1 (ephemeral port, own thread) replaying the trace under the plan."""
    from bench.server import ServerThread

    with ServerThread(bench_trace, plan=bench_plan) as thread:
        handle = BenchServerHandle(thread, bench_trace, bench_plan)
        request.node.stash.setdefault(_SERVERS, []).append(handle)
        yield handle


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120] or "run"


@pytest.fixture
def bench_run(request: pytest.FixtureRequest, bench_plan: "Plan | None", bench_trace: str,
              tmp_path_factory: pytest.TempPathFactory) -> Callable[..., BenchResult]:
    """`bench_run(target, *, plan=..., seed=..., trace=..., **RunConfig fields) -> BenchResult`.

    Runs the target (`NAME[:variant]` or `module:attr`) under the test's plan (or `plan=`),
    writes its report folder (and `repro.toml` when an invariant is violated) and returns it.
    """
    session: _Session = request.config.stash[_SESSION]
    root = session.report_root or tmp_path_factory.getbasetemp() / "bench-reports"
    test_path = Path(str(request.node.path)) if hasattr(request.node, "path") else None

    def run_target(target: str, *, plan: Any = _UNSET, seed: int | None = None, trace: str | None = None,
                   **options: Any) -> BenchResult:
        from bench.orchestration.repro import write_repro
        from bench.orchestration.runner import RunConfig
        from bench.report import write_report

        chosen = bench_plan if plan is _UNSET else _resolve_plan(plan, request.config.getoption("bench_seed"),
                                                                 test_path)
        if seed is not None and chosen is not None:
            chosen = chosen.with_seed(seed)
        config = RunConfig(trace=trace or bench_trace, plan=chosen, target=target, **options)
        folder = root / _slug(request.node.nodeid) / _slug(target)
        base, number = folder, 1
        while folder in session.used:
            number += 1
            folder = base.with_name(f"{base.name}-{number}")
        session.used.add(folder)
        if folder.exists():
            shutil.rmtree(folder)  # a previous session's report: never mix its repro file with this run
        from bench.orchestration.runner import run_blocking

        result = run_blocking(config)
        summary = write_report(result, folder)
        repro = write_repro(result, folder / "repro.toml")
        bench_result = BenchResult(result, folder, repro, summary)
        request.node.stash.setdefault(_RESULTS, []).append(bench_result)
        session.runs += 1
        session.failed_runs += not bench_result.ok
        return bench_result

    return run_target


# --- reporting ------------------------------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed or report.when == "teardown":
        return
    results = item.stash.get(_RESULTS, [])
    servers = item.stash.get(_SERVERS, [])
    if results or servers:
        text = "\n\n".join([r.explain() for r in results] + [s.explain() for s in servers])
        report.sections.append(("rollout-bench", text))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is None or not session.runs:
        return
    where = session.report_root or "pytest's temporary directory (--bench-report-dir to keep them)"
    terminalreporter.write_line(f"rollout-bench: {session.runs} runs, {session.failed_runs} with violations; "
                                f"reports under {where}")
