"""Real open-instruct over training steps (`run --steps K`): one trainer, one engine and one Ray runtime for the
whole run, each bench step four of open-instruct's training steps (16 groups, `prompts_per_step` 4; the first step
three and the last five: the generator is primed `async_steps` = 1 training step ahead).

- Clean, 4 steps: no finding of any kind. The trainer publishes its weights before each step (`update_weights`: the
  training steps done, 0, 3, 7, 11), and each step trains on prompts the step before drew and generated under the
  weights of then (lag 1, open-instruct's `max_result_age_steps`, the declared bound).
- Step 1 crashing (a reply whose scoring raises, `raise_after_generate` on g00016-1, step 1's first group): the
  verifier's exception ends open-instruct's gather thread (`process_from_queue`), and its health check
  (`check_background_threads`) raises that same exception at every later step: step 2 fails on step 1's
  trajectory (`step_carryover`, and step 2's trajectories pass in a fresh process). Prompts step 1 had put on the
  queue before it raised still go out during step 2 (`step_late_requests`, step 1's).
- Seed 001 (#1738) told apart over 4 steps: before the fix, results answered late are trained on two policies
  behind, across the step boundary (`staleness` and `step_lag`); after it, they are dropped and nothing is found.

Needs a checkout (`ROLLOUT_BENCH_OPEN_INSTRUCT_CHECKOUTS` or `ROLLOUT_BENCH_OPEN_INSTRUCT_PATH`) and the
open-instruct environment; each test skips saying which is missing. Heavy (Ray): run alone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, RunResult, run
from faults import plan_from_specs, resolve_plan
from tests.ray_helpers import ray_processes, worker_pid
from tests.test_target_open_instruct import CHECKOUTS, PYTHON, _has_1738, needs_open_instruct

PER_STEP = 64  # 16 groups of 4
OPTIONS = {"prompts_per_step": 4}  # async_steps 1
CRASH = "raise_after_generate:p=1,steps=1,trajectories=g00016-1"


def _fixed() -> Path:
    fixed = [c for c in CHECKOUTS if _has_1738(c)]
    if not fixed:
        pytest.skip("no checkout with #1738 among " + ", ".join(map(str, CHECKOUTS)))
    return fixed[0]


def _run(source: Path, steps: int, plan: Any = None) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=plan, target="open-instruct", n=PER_STEP, steps=steps,
                       on_step_failure="continue", python=PYTHON, watchdog_s=120.0,
                       target_options={"source": str(source), **OPTIONS})
    result = asyncio.run(run(config))
    print(f"{source}: {Counter((r.step, r.outcome) for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}")
    return result


def _bench_step(training_step: int) -> int:
    """The bench step that ran open-instruct's training step: 3 in step 0, then 4 a step."""
    return 0 if training_step < 3 else 1 + (training_step - 3) // 4


@needs_open_instruct
def test_four_clean_steps_keep_the_pipeline_and_find_nothing() -> None:
    result = _run(_fixed(), 4)
    assert result.violations == [], [v.message for v in result.violations]
    assert ray_processes({worker_pid(result)}) == []  # torn down once, after the last step
    rows = result.steps["rows"]  # type: ignore[index]
    assert [(row["published_by"], row["trainer_version"], row["weight_version"]) for row in rows] == [
        ("adapter", "0", "0"), ("adapter", "3", "3"), ("adapter", "7", "7"), ("adapter", "11", "11")]
    assert [row["error"] for row in rows] == [None] * 4 and [row["samples"] for row in rows] == [PER_STEP] * 4
    # each step's lag against the weights at hand-over: step 0's second training step already trains on what the
    # generator, primed one step ahead, made under v0 (lag 1), as every later step does
    assert [row["max_lag"] for row in rows] == [1, 1, 1, 1]
    consumed = Counter((r.step, _bench_step(r.details["training_step"])) for r in result.records)
    assert all(trained >= drawn for drawn, trained in consumed)  # nothing is trained before its step
    for step in range(3):  # the prompts in flight at each boundary are trained in the next step
        assert consumed[(step, step + 1)] > 0, consumed


@needs_open_instruct
def test_a_crashed_step_leaves_the_gather_thread_dead_for_the_next() -> None:
    result = _run(_fixed(), 3, plan_from_specs([CRASH], 0))
    rows = result.steps["rows"]  # type: ignore[index]
    assert result.steps["ran"] == 3  # type: ignore[index]
    assert [row["error"] and row["error"].split(":")[0] for row in rows] == [None, "InjectedFault", "InjectedFault"]
    carried = [v for v in result.violations if v.invariant == "step_carryover"]
    assert [(v.evidence["step"], v.evidence["after_step"]) for v in carried] == [(2, 1)]
    assert carried[0].evidence["error"]["trajectory"] == "g00016-1"  # step 1's trajectory: its error raised again
    assert carried[0].evidence["fresh_process"]["verdict"] == "passes in a fresh process: carried over"
    late = [v for v in result.violations if v.invariant == "step_late_requests"]
    assert all(v.evidence["step"] == 1 for v in late)
    assert {v.invariant for v in result.violations} <= {"step_carryover", "step_late_requests"}
    assert ray_processes({worker_pid(result)}) == []


@needs_open_instruct
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_seed_001_is_told_apart_over_steps(checkout: Path) -> None:
    result = _run(checkout, 4, resolve_plan("seed-001"))
    found = Counter(v.invariant for v in result.violations)
    if _has_1738(checkout):
        assert result.violations == [] and any(r.outcome == "dropped" for r in result.records)
    else:
        assert set(found) == {"staleness", "step_lag"}
        lagged = [v for v in result.violations if v.invariant == "step_lag"]
        assert all(v.evidence["bound"] == 1 and v.evidence["max_lag"] >= 2 for v in lagged)
        assert not any(r.outcome == "dropped" for r in result.records)


@needs_open_instruct
def test_a_step_too_small_for_the_priming_is_refused_naming_n() -> None:
    """4 groups a step make one training step of 4, and the generator is primed one training step ahead: step 0
    would train nothing, so the run is refused, saying which --n would do."""
    config = RunConfig(trace="rlvr-500", plan=None, target="open-instruct", n=16, steps=2, python=PYTHON,
                       watchdog_s=120.0, target_options={"source": str(_fixed()), **OPTIONS})
    result = asyncio.run(run(config))
    assert result.steps["rows"][0]["error"].startswith("ValueError: open-instruct over --steps 2")  # type: ignore[index]
    assert "at least 32" in result.steps["rows"][0]["error"]  # type: ignore[index]
    assert ray_processes({worker_pid(result)}) == []  # the run stops at the failed step: torn down there
