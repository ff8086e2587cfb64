"""Repro files of a multi-step run: the run again, up to and including the step that failed.

A subset of a multi-step run's trajectories is not a subset of its steps (what failed step k is what steps 0 to
k-1 left in the process), so a step's repro is not shrunk over trajectories and fault events as a one-step run's
is (`bench.orchestration.repro`). It is the same run cut after the failing step: steps = k+1, each step the same
slice of trajectories (written out, so the slices stay the run's), the rules in force during those steps with
their `steps` schedules, the same target, options and policy on a failed step. As a one-step repro, it is kept
only once the bench has rerun it and seen the same failure (invariant, error type, culprits); if the cut run does
not show it, the run as far as it went is tried, then the signature gets no file.

The failing step is the finding's own (`first_step` in its evidence, else its trajectory's step). Growth of a
resource needs `checks.MIN_STEPS_FOR_GROWTH` measured steps to show, so its cut keeps at least that many.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bench.invariants.base import Violation

from .board import plan_for_steps
from .checks import MIN_STEPS_FOR_GROWTH

if TYPE_CHECKING:
    from bench.orchestration.repro import Budget, ReproOutcome, Signature
    from bench.orchestration.runner import RunConfig, RunResult


def failing_step(result: "RunResult", violation: Violation) -> int | None:
    """The step a finding points at: its evidence's `first_step`, else the step of its trajectory."""
    if "first_step" in violation.evidence:
        return int(violation.evidence["first_step"])
    steps = {r.trajectory: r.step for r in result.records}
    return steps.get(violation.trajectory or "")


def step_counts(result: "RunResult", violation: Violation) -> list[int]:
    """How many steps the reruns keep, in the order tried: up to the failing step, then all that ran."""
    ran = int((result.steps or {}).get("ran") or result.config.steps)
    step = failing_step(result, violation)
    last = ran - 1 if step is None else min(step, ran - 1)
    if violation.invariant == "step_resources":
        last = min(max(last, MIN_STEPS_FOR_GROWTH - 1), ran - 1)
    return sorted({last + 1, ran})


def steps_config(result: "RunResult", count: int) -> "RunConfig":
    """The run cut after `count` steps: its first `count` slices by id, the rules of those steps."""
    ran = int((result.steps or {}).get("ran") or result.config.steps)
    size = len(result.records) // ran  # the records of the steps that ran, in step order, a slice each
    ids = [r.trajectory for r in result.records[: count * size]]
    return replace(result.config, steps=count, n=None, trajectories=ids,
                   compare_fresh=result.config.compare_fresh and count > 1,
                   plan=plan_for_steps(result.config.plan, range(count)))


def write_step_repros(result: "RunResult", folder: Path, budget: "Budget | None",
                      say: Callable[[str], None]) -> "list[ReproOutcome]":
    """One verified repro per failure signature of a multi-step run (`repro.toml`, `repro-<k>-<slug>.toml`)."""
    from bench.orchestration.repro import Budget, Candidate, ReproOutcome, signatures, write_config
    from bench.orchestration.runner import run_blocking

    outcomes = []
    found = signatures(result.violations)
    for number, (signature, violation) in enumerate(found, start=1):
        spent = replace(budget) if budget else Budget()
        spent.used, spent.started = 0, time.monotonic()
        say(f"repro {number}/{len(found)}: {signature.invariant} (a multi-step run: the run up to its failing step)")
        kept: tuple[int, "RunConfig"] | None = None
        for count in step_counts(result, violation):
            if not spent.left():
                break
            spent.used += 1
            config = steps_config(result, count)
            started = time.monotonic()
            again = run_blocking(config)
            found_again = signature.matches(again.violations)
            say(f"  rerun {spent.used}: steps 0-{count - 1}, {len(config.trajectories or [])} trajectories: "
                f"{'reproduced' if found_again else 'not reproduced'} ({time.monotonic() - started:.1f} s)")
            if found_again:
                kept = (count, config)
                break
        seconds = time.monotonic() - spent.started
        if kept is None:
            note = f"not reproduced in {spent.used} reruns ({seconds:.1f} s); the whole configuration is run.toml"
            say(f"  {note}")
            outcomes.append(ReproOutcome(signature, violation, None, spent.used, seconds, None, note))
            continue
        count, config = kept
        name = "repro.toml" if number == 1 else f"repro-{number}-{signature.slug}.toml"
        path = write_config(config, folder / name, result=result, signature=signature, violation=violation,
                            verified={"reruns": spent.used, "seconds": round(seconds, 3)})
        _note_steps(path, count, failing_step(result, violation), signature)
        say(f"  {path}: steps 0-{count - 1} of the run, seen failing the same way ({spent.used} reruns, "
            f"{seconds:.1f} s)")
        outcomes.append(ReproOutcome(signature, violation, path, spent.used, seconds,
                                     Candidate(list(config.trajectories or []), None)))
    return outcomes


def _note_steps(path: Path, count: int, step: int | None, signature: "Signature") -> None:
    """A comment under the header saying which steps the file reruns and why (for the reader)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    at = f"step {step}" if step is not None else "the run"
    lines.insert(1, f"# a multi-step run's repro: steps 0 to {count - 1} of the run, each on the run's slice of "
                    f"trajectories and rules ({signature.invariant} found at {at})")
    path.write_text("\n".join(lines), encoding="utf-8")
