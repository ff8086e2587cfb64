"""Repro files: the smallest rerun the bench has seen fail the same way, one per failure signature.

A failing run's violations fall into *signatures*: (invariant, error type, culprit trajectories). For
each, the bench builds a candidate rerun (the culprits' trajectories, whole groups for group-level
invariants, with exactly the fault events that hit them, each turned into a rule firing on that one
attempt, plus the plan's client-side and weight-update rules verbatim), reruns it and keeps it only if
the rerun shows the same signature. If that fails it reruns the whole run's configuration and, when
that reproduces, shrinks it by delta debugging over trajectories (or groups) and then over fault
events, within a budget of reruns. A signature the bench could not reproduce in its reruns gets no
repro file: the report says "not reproduced in K reruns" and `run.toml` keeps the full configuration.

Every input that matters is written: trace, target and options, interpreter, seed, rules, selection,
concurrency, time scale, watchdog, bounds, invariants, known findings and the bench version, so the
rerun judges the same way on another machine.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from bench import __version__
from bench.invariants import Bounds, Violation
from bench.records.atomic_write import write_text
from faults import FaultEvent, Plan, Rule, make_rule
from faults.plan import rule_table, toml_value

from .known import shipped_known
from .repro_file import config_error, read_repro_data, repro_rules
from .runner import RunConfig, RunResult, run_blocking

# Invariants judged over a whole group (or the batch around it): their repros keep whole groups.
GROUP_LEVEL = {"group_completeness", "accounting", "retry_discipline"}
# Run-level findings that need the whole run to show (a hang, a rule never reached): not shrunk.
WHOLE_RUN = {"liveness", "vacuity", "replay_fidelity"}


@dataclass(frozen=True)
class Signature:
    """What makes two failures the same: the invariant, the error type (crashes) and who failed."""

    invariant: str
    error_type: str | None
    culprits: tuple[str, ...]

    @property
    def slug(self) -> str:
        return self.invariant + (f"-{self.error_type}" if self.error_type else "")

    def matches(self, violations: Iterable[Violation]) -> bool:
        """A rerun shows this failure: same invariant and error type, on one of the same culprits."""
        for violation in violations:
            if violation.invariant != self.invariant or _error_type(violation) != self.error_type:
                continue
            if not self.culprits or violation.trajectory in self.culprits or violation.trajectory is None:
                return True
        return False


def _error_type(violation: Violation) -> str | None:
    value = violation.evidence.get("error_type")
    return str(value) if value is not None else None


def signatures(violations: list[Violation]) -> list[tuple[Signature, Violation]]:
    """The run's distinct failures, in the order their first violation was found, each with that violation."""
    seen: dict[tuple[str, str | None], tuple[list[str], Violation]] = {}
    for violation in violations:
        key = (violation.invariant, _error_type(violation))
        culprits, _ = seen.setdefault(key, ([], violation))
        if violation.trajectory and violation.trajectory not in culprits:
            culprits.append(violation.trajectory)
    return [(Signature(key[0], key[1], tuple(culprits)), first) for key, (culprits, first) in seen.items()]


@dataclass
class Candidate:
    """One rerun: these trajectories, these exact fault events, everything else as in the run."""

    trajectories: list[str]
    events: list[FaultEvent] | None  # None: the run's plan as it was (the whole run, rules that never fired too)


@dataclass
class ReproOutcome:
    signature: Signature
    violation: Violation
    path: Path | None  # None: not reproduced
    reruns: int
    seconds: float
    candidate: Candidate | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"invariant": self.signature.invariant, "error_type": self.signature.error_type,
                "culprits": list(self.signature.culprits), "path": str(self.path) if self.path else None,
                "reproduced": self.path is not None, "reruns": self.reruns, "seconds": round(self.seconds, 3),
                "trajectories": len(self.candidate.trajectories) if self.candidate else None,
                "fault_events": len(self.candidate.events) if self.candidate and self.candidate.events is not None
                else None, "note": self.note}


@dataclass
class Budget:
    """How hard the bench tries: reruns and seconds per signature."""

    reruns: int = 12
    seconds: float = 300.0
    minimise: bool = True
    used: int = 0
    started: float = field(default_factory=time.monotonic)

    def left(self) -> bool:
        return self.used < self.reruns and time.monotonic() - self.started < self.seconds


class _OutOfBudget(Exception):
    pass


def _exact_rules(events: list[FaultEvent], rules: dict[str, Rule]) -> list[Rule]:
    out = []
    for index, event in enumerate(events):
        params = rules[event.rule].fault.describe() if event.rule in rules else {}
        values = {"fault": event.fault, "name": f"{event.rule}@{index}", **params,
                  "trajectories": [event.trajectory], "turns": [event.turn], "attempts": [event.attempt]}
        out.append(make_rule(values, values["name"]))
    return out


def _kept_rules(plan: Plan | None) -> list[Rule]:
    """Rules a repro keeps as they are: those acting in the target (client-side) or on weight updates, which
    the fault log cannot replay event by event."""
    return [r for r in (plan.rules if plan else ()) if not r.fault.server_side or r.fault.on_weight_update]


def candidate_config(result: RunResult, candidate: Candidate) -> RunConfig:
    plan = result.config.plan
    if candidate.events is None:
        return replace(result.config, trajectories=list(candidate.trajectories), n=None)
    rules = {r.name: r for r in (plan.rules if plan else ())}
    exact = _exact_rules(candidate.events, rules)
    repro_plan = Plan(f"repro of {plan.name if plan else 'none'}", plan.seed if plan else 0,
                      tuple(exact + _kept_rules(plan)), "repro", plan.source if plan else None,
                      **({"window_from": plan.window_from} if plan else {}))
    return replace(result.config, plan=repro_plan, trajectories=list(candidate.trajectories), n=None)


def _units(result: RunResult, signature: Signature, trajectories: list[str]) -> list[list[str]]:
    """What delta debugging removes or keeps together: trajectories, or whole groups for group-level findings."""
    if signature.invariant not in GROUP_LEVEL:
        return [[t] for t in trajectories]
    group_of = {r.trajectory: r.group for r in result.records}
    groups: dict[str, list[str]] = {}
    for trajectory in trajectories:
        groups.setdefault(group_of.get(trajectory, trajectory), []).append(trajectory)
    return list(groups.values())


def _flatten(units: list[list[str]]) -> list[str]:
    return [t for unit in units for t in unit]


def _events_for(result: RunResult, trajectories: Iterable[str]) -> list[FaultEvent]:
    chosen = set(trajectories)
    return [e for e in result.fault_events if e.trajectory in chosen]


def ddmin(items: list[Any], fails: Callable[[list[Any]], bool]) -> list[Any]:
    """Zeller's delta debugging: a 1-minimal sublist of `items` on which `fails` still holds."""
    granularity = 2
    while len(items) >= 2:
        size = max(1, len(items) // granularity)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for index, chunk in enumerate(chunks):
            if fails(chunk):
                items, granularity = chunk, 2
                break
            complement = [x for j, c in enumerate(chunks) if j != index for x in c]
            if len(chunks) > 2 and fails(complement):
                items, granularity = complement, max(granularity - 1, 2)
                break
        else:
            if granularity >= len(items):
                break
            granularity = min(len(items), granularity * 2)
    return items


class Reproducer:
    """Reruns candidates for one signature, counting reruns, printing progress and keeping the smallest
    candidate seen to fail the same way."""

    def __init__(self, result: RunResult, signature: Signature, budget: Budget,
                 say: Callable[[str], None]) -> None:
        self.result, self.signature, self.budget, self.say = result, signature, budget, say
        self.selection = [r.trajectory for r in result.records]
        self.best: Candidate | None = None

    def reproduces(self, candidate: Candidate) -> bool:
        """Rerun `candidate`; when it fails the same way it becomes the best so far."""
        if not self.budget.left():
            raise _OutOfBudget
        self.budget.used += 1
        started = time.monotonic()
        again = run_blocking(candidate_config(self.result, candidate))
        found = self.signature.matches(again.violations)
        self.say(f"  rerun {self.budget.used}: {len(candidate.trajectories)} trajectories, "
                 f"{_events_text(candidate)}: {'reproduced' if found else 'not reproduced'} "
                 f"({time.monotonic() - started:.1f} s)")
        if found:
            self.best = candidate
        return found

    def _on(self, trajectories: list[str], events: list[FaultEvent] | None = None) -> bool:
        """Rerun these trajectories with `events` (default: every fault event that hit them)."""
        return self.reproduces(Candidate(trajectories, _events_for(self.result, trajectories)
                                         if events is None else events))

    def find(self) -> Candidate | None:
        """The smallest candidate seen to fail the same way, or None."""
        signature = self.signature
        try:
            if signature.culprits and signature.invariant not in WHOLE_RUN:
                units = self._culprit_units()
                for chosen in ([units[0]], units) if len(units) > 1 else ([units[0]],):  # one culprit, then all
                    if self._on(_flatten(chosen)):
                        return self._fewer_events()
            if not self.reproduces(Candidate(self.selection, None)):  # the whole run, its own plan
                return None
            if not self.budget.minimise or signature.invariant in WHOLE_RUN:
                return self.best
            self._fewer_trajectories()
            return self._fewer_events()
        except _OutOfBudget:
            return self.best

    def _culprit_units(self) -> list[list[str]]:
        """The culprits, each with its whole group for a group-level finding."""
        units = _units(self.result, self.signature, self.selection)
        return [unit for unit in units if set(unit) & set(self.signature.culprits)]

    def _fewer_trajectories(self) -> None:
        assert self.best is not None
        try:
            ddmin(_units(self.result, self.signature, self.best.trajectories),
                  lambda units: self._on(_flatten(units)))
        except _OutOfBudget:
            pass

    def _fewer_events(self) -> Candidate | None:
        assert self.best is not None
        trajectories = self.best.trajectories
        events = self.best.events if self.best.events is not None else _events_for(self.result, trajectories)
        if not self.budget.minimise or not events:
            return self.best
        try:
            if not self._on(trajectories, []):  # else it fails on valid replies alone
                ddmin(list(events), lambda kept: self._on(trajectories, kept))
        except _OutOfBudget:
            pass
        return self.best


def _events_text(candidate: Candidate) -> str:
    return "the run's plan" if candidate.events is None else f"{len(candidate.events)} fault events"


def write_repros(result: RunResult, folder: str | Path, *, budget: Budget | None = None,
                 say: Callable[[str], None] | None = None) -> list[ReproOutcome]:
    """Verify and write one repro per failure signature: `repro.toml` for the first, `repro-<k>-<slug>.toml`
    for the others; `run.toml` (the whole run's configuration) is always written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_config(result.config, folder / "run.toml", result=result)
    say = say or (lambda line: print(line, file=sys.stderr))
    if result.config.steps > 1:  # a rerun of some trajectories is not a rerun of some steps: the run up to a step
        from bench.steps.repro import write_step_repros

        return write_step_repros(result, folder, budget, say)
    outcomes = []
    found = signatures(result.violations)
    for number, (signature, violation) in enumerate(found, start=1):
        spent = replace(budget) if budget else Budget()
        spent.used, spent.started = 0, time.monotonic()
        say(f"repro {number}/{len(found)}: {signature.invariant}"
            + (f" ({signature.error_type})" if signature.error_type else "")
            + (f" on {', '.join(signature.culprits[:5])}" if signature.culprits else ""))
        reproducer = Reproducer(result, signature, spent, say)
        candidate = reproducer.find()
        seconds = time.monotonic() - spent.started
        if candidate is None:
            note = f"not reproduced in {spent.used} reruns ({seconds:.1f} s); the whole configuration is run.toml"
            say(f"  {note}")
            outcomes.append(ReproOutcome(signature, violation, None, spent.used, seconds, None, note))
            continue
        name = "repro.toml" if number == 1 else f"repro-{number}-{signature.slug}.toml"
        path = write_config(candidate_config(result, candidate), folder / name, result=result,
                            signature=signature, violation=violation,
                            verified={"reruns": spent.used, "seconds": round(seconds, 3)},
                            events=candidate.events)
        say(f"  {path}: {len(candidate.trajectories)} trajectories, {_events_text(candidate)}, "
            f"seen failing the same way ({spent.used} reruns, {seconds:.1f} s)")
        outcomes.append(ReproOutcome(signature, violation, path, spent.used, seconds, candidate))
    return outcomes


def write_repro(result: RunResult, path: str | Path, *, budget: Budget | None = None,
                say: Callable[[str], None] | None = None) -> Path | None:
    """The verified repro of the run's first failure signature at `path`; None when the run had none or the
    bench could not reproduce it (see `write_repros` for every signature)."""
    path = Path(path)
    outcomes = write_repros(result, path.parent, budget=budget or Budget(reruns=4, minimise=False),
                            say=say or (lambda line: None))
    first = outcomes[0] if outcomes else None
    if first is None or first.path is None:
        return None
    if first.path != path:
        first.path.replace(path)
    return path


def _known_spec(config: RunConfig, result: RunResult | None) -> str | None:
    """A shipped file by its name (the repro moves between checkouts and installs), else its absolute path."""
    if not config.known:
        return None
    path = Path((result.known_file if result else None) or str(config.known)).resolve()
    names = {shipped.resolve(): name for name, shipped in shipped_known().items()}
    return names.get(path, str(path))


def write_config(config: RunConfig, path: Path, *, result: RunResult | None = None,
                 signature: Signature | None = None, violation: Violation | None = None,
                 verified: dict[str, Any] | None = None, events: list[FaultEvent] | None = None) -> Path:
    """A run configuration as a file `rollout-bench run --repro` reads back: every input that matters."""
    plan = config.plan
    lines = ["# rollout-bench repro: rerun with `rollout-bench run --repro <this file>`",
             f"bench_version = {toml_value(__version__)}",
             f"trace = {toml_value(config.trace)}",
             f"target = {toml_value(config.target)}",
             f"target_options = {toml_value(config.target_options)}",
             f"isolation = {toml_value(config.isolation)}"]
    if config.upstream:  # the run's answers came from this live engine (through the fault proxy)
        lines.append(f"upstream = {toml_value(config.upstream)}")
    if config.tokenizer_dir:  # the trace's ids are in this tokenizer, not the bench's
        lines.append(f"tokenizer_dir = {toml_value(config.tokenizer_dir)}")
    if config.python:
        lines.append(f"python = {toml_value(config.python)}")
    if result is not None and result.worker and result.worker.get("python"):
        lines.append(f"# the worker ran under {result.worker['python']}")
    lines += [f"seed = {plan.seed if plan else 0}",
              f"plan = {toml_value(plan.name if plan else 'none')}",
              f"window_from = {toml_value(plan.window_from if plan else 'first_request')}",
              f"concurrency = {config.concurrency}",
              f"time_scale = {toml_value(config.time_scale)}",
              f"watchdog_s = {toml_value(config.watchdog_s)}",
              f"deadline_s = {toml_value(config.deadline_s)}"]
    if config.invariants is not None:
        lines.append(f"invariants = {toml_value(config.invariants)}")
    else:
        lines.append("# invariants: all of this bench version's")
    known = _known_spec(config, result)
    if known:  # the same findings stay known in the rerun
        lines.append(f"known = {toml_value(known)}")
    if config.steps > 1:  # a multi-step run: its steps and policy; its slices come from `n` (steps that ran or not)
        lines += [f"steps = {config.steps}", f"on_step_failure = {toml_value(config.on_step_failure)}"]
        if config.compare_fresh:
            lines.append("compare_fresh = true")
    trajectories = config.trajectories if config.trajectories is not None else (
        [r.trajectory for r in result.records] if result is not None and config.steps == 1 else None)
    if trajectories is not None:
        lines.append(f"trajectories = {toml_value(trajectories)}")
    elif config.n is not None:
        lines.append(f"n = {config.n}")
    if signature is not None and violation is not None:
        lines += [f"invariant = {toml_value(signature.invariant)}",
                  f"error_type = {toml_value(signature.error_type or '')}",
                  f"culprits = {toml_value(list(signature.culprits))}",
                  f"message = {toml_value(violation.message)}"]
    if verified is not None:
        lines.append(f"verified = {{reruns = {verified['reruns']}, seconds = {verified['seconds']}}}")
    lines += ["", "[bounds]"] + [f"{k} = {toml_value(v)}" for k, v in asdict(config.bounds).items() if v is not None]
    for rule in (plan.rules if plan else ()):
        lines += ["", "[[rules]]"] + [f"{key} = {toml_value(value)}" for key, value in rule_table(rule).items()]
    for event in events or ():  # what the exact rules came from, for the reader
        lines += ["", "[[events]]", f"rule = {toml_value(event.rule)}", f"fault = {toml_value(event.fault)}",
                  f"trajectory = {toml_value(event.trajectory)}", f"turn = {event.turn}",
                  f"attempt = {event.attempt}"]
    write_text(path, "\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Repro:
    config: RunConfig
    invariant: str


def load_repro(path: str | Path, **overrides: Any) -> Repro:
    """The run a repro (or run.toml) file describes; keyword arguments override what it recorded. A problem with
    the file names it, the line and the key (`repro.toml:9: seed: not an integer: 'abc'`)."""
    path = Path(path)
    text, data = read_repro_data(path)
    rules = repro_rules(text, path, data)
    try:
        name = data["plan"]  # run.toml (no invariant) is the run itself, under its own plan's name
        repro_name = name if name.startswith("repro of ") or "invariant" not in data else f"repro of {name}"
        plan = Plan(repro_name, data["seed"], tuple(rules), f"repro: {data.get('invariant', 'run')}", str(path),
                    **({"window_from": data["window_from"]} if "window_from" in data else {}))
        recorded: dict[str, Any] = {"isolation": data.get("isolation", "process"),
                                    "target_options": dict(data.get("target_options", {})), "known": data.get("known")}
        for key in ("python", "concurrency", "time_scale", "watchdog_s", "deadline_s", "invariants", "n", "upstream",
                    "tokenizer_dir", "steps", "on_step_failure", "compare_fresh"):
            if key in data:
                recorded[key] = data[key]
        if "bounds" in data:
            recorded["bounds"] = Bounds(**data["bounds"])
        recorded.update(trace=data["trace"], plan=plan, target=data["target"],
                        trajectories=list(data["trajectories"]) if "trajectories" in data else None)
        config = RunConfig(**{**recorded, **overrides})
        return Repro(config, data.get("invariant", ""))
    except (KeyError, TypeError, ValueError) as error:
        raise config_error(text, path, data, error) from None
