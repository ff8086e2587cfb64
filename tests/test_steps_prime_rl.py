"""Real prime-rl over training steps (`run --steps K`): one Scheduler, TrainEnvs (one env server), Buffer and pool
for the whole run, `generate_batch(step)` per step on the step's groups, and between steps the trainer's
checkpoint, which the scheduler's own policy-update loop applies through the server's admin routes (prime-rl's vLLM
server's `/pause`, `/update_weights`, `/resume`).

- Clean, 4 steps: no finding of any kind; the trainer is as far behind as `max_async_level` (1) lets it be, so the
  steps are served checkpoints 0, 0, 1, 2, each applied before its step by the scheduler's calls, in prime-rl's order.
- Step 1 with a reply whose post-processing raises (`raise_after_generate` on g00004-1, step 1's first group): the
  env server's error comes back as an errored group, which the scheduler drops and the bench's buffer replays until it
  gives up (the churn `retry_discipline` reports); the group's members are reported failed, and the later steps
  run clean: nothing of step 1 carries over (no step finding).

Needs a checkout (`ROLLOUT_BENCH_PRIME_RL_CHECKOUTS` or `ROLLOUT_BENCH_PRIME_RL_PATH`) and the prime-rl
environment; skips saying which is missing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, RunResult, run
from faults import plan_from_specs
from tests.test_target_prime_rl import CHECKOUTS, PYTHON, _env_processes, needs_prime_rl

PER_STEP = 16  # 4 groups of 4
CRASH = "raise_after_generate:p=1,steps=1,trajectories=g00004-1"
SYNC = ["/pause", "/update_weights", "/resume"]


def _run(source: Path, steps: int, plan: Any = None) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=plan, target="prime-rl", n=PER_STEP, steps=steps,
                       on_step_failure="continue", python=PYTHON, watchdog_s=120.0, time_scale=0.05,
                       target_options={"source": str(source)})
    result = asyncio.run(run(config))
    print(f"{source}: {Counter((r.step, r.outcome) for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}")
    return result


@needs_prime_rl
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_four_clean_steps_on_one_scheduler_find_nothing(checkout: Path) -> None:
    result = _run(checkout, 4)
    assert result.violations == [], [v.message for v in result.violations]
    assert _env_processes(result) == []  # the env server torn down once, after the last step
    rows = result.steps["rows"]  # type: ignore[index]
    assert [(row["published_by"], row["trainer_version"], row["weight_version"]) for row in rows] == [
        ("adapter", "0", "0"), ("adapter", "0", "0"), ("adapter", "1", "1"), ("adapter", "2", "2")]
    assert [row["versions_served"] for row in rows] == [["0"], ["0"], ["1"], ["2"]]
    # each record carries the checkpoint prime-rl sent it under (its cache salt): the step's, lag 0
    assert {(r.step, tuple(r.weight_versions)) for r in result.records} == {
        (0, ("0",)), (1, ("0",)), (2, ("1",)), (3, ("2",))}
    assert [row["max_lag"] for row in rows] == [0, 0, 0, 0]
    assert [row["samples"] for row in rows] == [PER_STEP] * 4 and [row["error"] for row in rows] == [None] * 4
    calls = [q for q in result.requests if q.endpoint in SYNC]
    assert [q.endpoint for q in calls] == SYNC * 2  # checkpoint 0 is the initial weights: never sent
    step_of = {r.trajectory: r.step for r in result.records}
    resumed = [q.started for q in calls if q.endpoint == "/resume"]
    for q in result.requests:  # every request of steps 2 and 3 went out after its checkpoint was applied
        if step_of.get(q.trajectory or "", 0) >= 2:
            assert q.started > resumed[step_of[q.trajectory] - 2]


@needs_prime_rl
def test_a_poisoned_group_in_step_1_is_dropped_and_later_steps_run_clean() -> None:
    result = _run(CHECKOUTS[0], 3, plan_from_specs([CRASH], 0))
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None, None, None]
    failed = sorted(r.trajectory for r in result.records if r.outcome == "failed")
    assert failed == ["g00004-0", "g00004-1", "g00004-2", "g00004-3"]
    assert {v.invariant for v in result.violations} == {"retry_discipline"}  # the dropped group's replays
    assert all(v.trajectory.startswith("g00004-") for v in result.violations)
    assert [row["n_completed"] + row["n_truncated"] for row in rows] == [PER_STEP, PER_STEP - 4, PER_STEP]
    assert _env_processes(result) == []
