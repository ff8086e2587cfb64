"""Real miles and slime for 3 training steps in one worker (`run --steps 3`), step 1 crashing in the middle.

The crash is the seed-000 one: a valid reply whose post-processing raises (`raise_after_generate`, on one
trajectory of step 1). The unfixed rollout lets it out of `generate_rollout`, leaving the `GenerateState`
singleton as it was mid-rollout (its `remaining_batch_size` not reset, its pending set emptied): the next step
submits nothing and waits on no task, `ValueError: Set of Tasks/Futures is empty`, a failure that step 1 left
behind: step 2's trajectories rerun alone in a fresh worker complete. The patched rollout keeps a placeholder
for the trajectory that raised; all three steps complete.

Needs the miles environment (make targets), and for slime a checkout (`ROLLOUT_BENCH_SLIME_PATH`) and an
environment to run it; each test skips saying which is missing.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import pytest

from bench import RunConfig, RunResult, run
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.slime.target import PATH_ENV
from faults import plan_from_specs

CRASH = "raise_after_generate:p=1,steps=1,trajectories=g00002-1"  # step 1's first group holds g00002-1
MILES_PYTHON = target_python("miles")
SLIME_PATH = os.environ.get(PATH_ENV)
SLIME_PYTHON = target_python("slime") or MILES_PYTHON
FRAMEWORKS = {
    "miles": pytest.param("miles", MILES_PYTHON, {}, marks=pytest.mark.skipif(
        MILES_PYTHON is None, reason="the miles environment is not built (make targets)")),
    "slime": pytest.param("slime", SLIME_PYTHON, {"source": SLIME_PATH}, marks=pytest.mark.skipif(
        SLIME_PATH is None or SLIME_PYTHON is None,
        reason=f"no slime checkout ({PATH_ENV}) or no environment to run it (make slime-env)")),
}


def _run(target: str, python: str | None, options: dict[str, object]) -> RunResult:
    config = RunConfig(trace="agentic-500", plan=plan_from_specs([CRASH], 0), target=target, n=8, steps=3,
                       on_step_failure="continue", python=python, watchdog_s=120.0, time_scale=0.05,
                       target_options=options)
    result = asyncio.run(run(config))
    print(f"{target}: {Counter((r.step, r.outcome) for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}")
    return result


@pytest.mark.parametrize("framework, python, options", FRAMEWORKS.values(), ids=list(FRAMEWORKS))
def test_a_crashed_step_leaves_the_next_one_failing(framework: str, python: str, options: dict[str, object]) -> None:
    result = _run(f"{framework}:unfixed", python, options)
    assert result.steps is not None and result.steps["ran"] == 3
    errors = [row["error"] and row["error"].split(":")[0] for row in result.steps["rows"]]
    assert errors == [None, "InjectedFault", "ValueError"]
    assert [row["requests"] for row in result.steps["rows"]][2] == 0  # step 2 asked the server for nothing
    carried = [v for v in result.violations if v.invariant == "step_carryover"]
    assert [(v.evidence["step"], v.evidence["after_step"]) for v in carried] == [(2, 1)]
    assert "Set of Tasks/Futures is empty" in carried[0].evidence["error"]["message"]
    assert carried[0].evidence["fresh_process"]["verdict"] == "passes in a fresh process: carried over"
    assert result.steps["first_violation"]["step"] == 1  # the crash itself (batch_survival: seed-000's bug)


@pytest.mark.parametrize("framework, python, options", FRAMEWORKS.values(), ids=list(FRAMEWORKS))
def test_the_patched_rollout_runs_every_step(framework: str, python: str, options: dict[str, object]) -> None:
    result = _run(f"{framework}:patched", python, options)
    assert result.violations == [], [v.message for v in result.violations]
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None, None, None]
    assert [row["n_completed"] + row["n_aborted"] for row in rows] == [8, 8, 8]
    assert rows[1]["n_aborted"] == 1  # the placeholder for the trajectory whose post-processing raised
    assert [row["versions_served"] for row in rows] == [["0"], ["1"], ["2"]]
