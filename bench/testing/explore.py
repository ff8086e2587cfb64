"""Explore fault schedules against a target, and shrink a failure to the smallest plan that still fails.

Hypothesis does the searching and the shrinking: a plan strategy (`faults.strategies`) is
the search space and "this run violates the invariant" is the condition given to
`hypothesis.find`, which returns the *minimal* plan that satisfies it. For a plan already
known to fail, `shrink_plan` searches the sub-plans made of the rules that fired in the
failing run (a rule that never fired changed nothing), so a 28-rule chaos plan comes back
as the one rule that breaks the target.

Every run is a real bench run (server, target, invariants); identical plans are run once
(the search revisits them while shrinking). To keep a search quick, `n` runs only the first
n trajectories, cut into a small trace once (fault decisions hash trajectory ids, so a rule
fires on the same trajectories as in the full trace), and reference targets run inline.
The minimal plan is then run once more on the full trace (`confirmed` says it failed there).

Settings come from the current Hypothesis profile (see `bench.testing.hypothesis_profiles`):
derandomized on pull requests, randomized with a kept example database at night.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import hypothesis
from hypothesis.errors import NoSuchExample
from hypothesis.strategies import SearchStrategy

from bench.orchestration.runner import RunConfig, RunResult, run_blocking
from bench.trace.reader import open_binary
from bench.trace.shipped import DEFAULT_TRACE, resolve_trace
from faults import Plan
from faults.plan import plan_to_toml
from faults.strategies import sub_plans

META_INVARIANTS = frozenset({"vacuity"})  # about the plan, not the target: never what a search looks for


# --- plans as TOML ----------------------------------------------------------------------------

def write_plan(plan: Plan, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(plan_to_toml(plan), encoding="utf-8")
    return path


# --- running plans ----------------------------------------------------------------------------

def violated(result: RunResult, invariants: Iterable[str] | None = None) -> set[str]:
    """The invariants the run broke (vacuity aside), limited to `invariants` when given."""
    names = {v.invariant for v in result.violations} - META_INVARIANTS
    return names if invariants is None else names & set(invariants)


def prefix_trace(trace: str, n: int, folder: str | Path) -> Path:
    """The trace's header and first `n` trajectories, copied line for line into `folder`."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    source = resolve_trace(trace)
    out = Path(folder) / f"{source.name.split('.')[0]}-first{n}.jsonl"
    with open_binary(source) as lines, open(out, "wb") as sink:
        for count, line in enumerate(lines):
            if count > n:
                break
            sink.write(line if line.endswith(b"\n") else line + b"\n")
    return out


class PlanRunner:
    """Runs a target under plans on one trace; each distinct plan once (the search revisits plans)."""

    def __init__(self, target: str, trace: str, *, trajectories: list[str] | None = None,
                 **run_options: Any) -> None:
        fields = {f.name for f in dataclasses.fields(RunConfig)}
        unknown = set(run_options) - fields
        if unknown:
            raise TypeError(f"unknown run options {', '.join(sorted(unknown))}; RunConfig has {', '.join(sorted(fields))}")
        if "isolation" in fields:
            run_options.setdefault("isolation", "inline")  # a search runs many short plans: no worker per run
        self.target, self.trace, self.trajectories, self.options = target, trace, trajectories, run_options
        self.results: dict[str, RunResult] = {}

    def __call__(self, plan: Plan) -> RunResult:
        key = repr((plan.seed, plan.rules))
        if key not in self.results:
            config = RunConfig(trace=self.trace, plan=plan, target=self.target, trajectories=self.trajectories,
                               **self.options)
            self.results[key] = run_blocking(config)
        return self.results[key]

    @property
    def runs(self) -> int:
        return len(self.results)


@dataclass
class Exploration:
    """What a search found: the smallest failing plan and its run."""

    plan: Plan  # the minimal plan
    result: RunResult  # its run (on the full trace when `confirmed` is not None)
    invariants: frozenset[str]  # what counted as a failure
    runs: int  # distinct plans run during the search
    confirmed: bool | None  # the minimal plan failed on the full trace too (None: not checked)
    original: Plan | None = None  # the plan that was shrunk, if any
    candidates: tuple[str, ...] = ()  # the rules a shrink chose from (those that fired in the failing run)

    @property
    def violations(self) -> list[Any]:
        return [v for v in self.result.violations if v.invariant in self.invariants]

    def write(self, path: str | Path) -> Path:
        """The minimal plan as a plan file (`rollout-bench run --plan <it>`)."""
        return write_plan(self.plan, path)


def search_settings(max_examples: int | None = None) -> hypothesis.settings:
    """The current profile's settings, without a deadline (each example is a whole run)."""
    base = hypothesis.settings()
    return hypothesis.settings(base, deadline=None, max_examples=max_examples or base.max_examples)


def _database_key(*parts: Any) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def _find(strategy: SearchStrategy[Plan], fails: Callable[[Plan], bool], settings: hypothesis.settings,
          key: bytes) -> Plan | None:
    try:
        return hypothesis.find(strategy, fails, settings=settings, database_key=key)
    except NoSuchExample:
        return None


def _finish(runner: PlanRunner, minimal: Plan, wanted: frozenset[str], trace: str, n: int | None,
            searched_on: str, original: Plan | None, candidates: tuple[str, ...] = ()) -> Exploration:
    result, confirmed = runner(minimal), None
    if searched_on != trace or n is not None:
        full = PlanRunner(runner.target, trace, trajectories=runner.trajectories, n=n, **runner.options)
        result = full(minimal)
        confirmed = bool(violated(result, wanted))
    return Exploration(minimal, result, wanted, runner.runs, confirmed, original, candidates)


def explore(target: str, plans: SearchStrategy[Plan], *, trace: str = DEFAULT_TRACE, n: int | None = None,
            trajectories: list[str] | None = None, invariants: Iterable[str] | None = None,
            settings: hypothesis.settings | None = None, **run_options: Any) -> Exploration | None:
    """Search `plans` for one that makes `target` violate an invariant; the minimal such plan, or None.

    `invariants` limits what counts (default: any but vacuity). `run_options` go to `RunConfig`
    (e.g. `watchdog_s`, `concurrency`, `isolation`).
    """
    wanted = frozenset(invariants) if invariants is not None else None
    with tempfile.TemporaryDirectory(prefix="rollout-bench-explore-") as tmp:
        searched_on = str(prefix_trace(trace, n, tmp)) if n is not None else trace
        runner = PlanRunner(target, searched_on, trajectories=trajectories, **run_options)
        minimal = _find(plans, lambda plan: bool(violated(runner(plan), wanted)), settings or search_settings(),
                        _database_key("explore", target, trace, n, trajectories, sorted(wanted or ())))
        if minimal is None:
            return None
        found = frozenset(violated(runner(minimal), wanted))
        return _finish(runner, minimal, found, trace, n, searched_on, None)


def shrink_plan(target: str, plan: Plan, *, trace: str = DEFAULT_TRACE, n: int | None = None,
                trajectories: list[str] | None = None, invariants: Iterable[str] | None = None,
                settings: hypothesis.settings | None = None, **run_options: Any) -> Exploration:
    """The smallest sub-plan of `plan` under which `target` still violates the same invariant.

    "The same invariant" is the first one the full plan's run violated (the one its repro
    file names), unless `invariants` says which count. Raises ValueError when the full plan
    does not fail at all.
    """
    with tempfile.TemporaryDirectory(prefix="rollout-bench-shrink-") as tmp:
        searched_on = str(prefix_trace(trace, n, tmp)) if n is not None else trace
        runner = PlanRunner(target, searched_on, trajectories=trajectories, **run_options)
        full = runner(plan)
        failing = [v.invariant for v in full.violations if v.invariant not in META_INVARIANTS]
        if not failing:
            where = f"the first {n} trajectories of {trace}" if n is not None else trace
            raise ValueError(f"plan {plan.name!r} (seed {plan.seed}) does not make {target} violate any invariant "
                             f"on {where}: nothing to shrink")
        wanted = frozenset(invariants) if invariants is not None else frozenset(failing[:1])
        if not violated(full, wanted):
            raise ValueError(f"plan {plan.name!r} makes {target} violate {sorted(set(failing))}, "
                             f"not {sorted(wanted)}: nothing to shrink")

        def fails(candidate: Plan) -> bool:
            return bool(violated(runner(candidate), wanted))

        fired = {e.rule for e in full.fault_events} | {r.name for r in plan.rules if not r.fault.server_side}
        key = _database_key("shrink", target, trace, n, trajectories, plan_to_toml(plan), sorted(wanted))
        chosen = settings or search_settings()
        minimal = _find(sub_plans(plan, candidates=fired), fails, chosen, key)
        if minimal is None:  # the rules that fired did not fail alone (a timing effect): search every rule
            minimal = _find(sub_plans(plan), fails, chosen, key) or plan
        ordered = tuple(r.name for r in plan.rules if r.name in fired)
        return _finish(runner, minimal, wanted, trace, n, searched_on, plan, ordered)


def check_plan(target: str, plan: Plan, *, trace: str = DEFAULT_TRACE, trajectories: list[str] | None = None,
               invariants: Iterable[str] | None = None, **run_options: Any) -> RunResult:
    """Run `target` under `plan`; AssertionError naming the plan (as TOML) and the violations if any.

    For `@given(plan=plans(...))` property tests: Hypothesis shrinks the failing plan and
    prints it, ready to save as a plan file.
    """
    result = PlanRunner(target, trace, trajectories=trajectories, **run_options)(plan)
    broken = violated(result, invariants)
    if broken:
        details = "\n".join(f"  {v.invariant} [{v.trajectory}] {v.message}" for v in result.violations
                            if v.invariant in broken)
        raise AssertionError(f"{target} violates {', '.join(sorted(broken))} under plan (seed {plan.seed}):\n"
                             f"{plan_to_toml(plan)}violations:\n{details}")
    return result


__all__ = ["Exploration", "PlanRunner", "check_plan", "explore", "plan_to_toml", "prefix_trace", "search_settings",
           "shrink_plan", "violated", "write_plan"]
