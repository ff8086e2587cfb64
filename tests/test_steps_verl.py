"""Real verl (0.8.0 and 0.9.1) for 4 or 5 training steps in one worker (`run --steps K`), as its sync trainer runs
them: one Ray runtime, one agent-loop manager and one replay buffer for every step, `global_steps` advancing, and
between steps the trainer's calls to its SGLang server (`bench/targets/frameworks/verl/weights.py`).

Step 1 meets the seed-000 crash: one reply whose post-processing raises (`raise_after_generate`, on g00002-1). In
verl that is a session failing where it is scored: its root ends `failure` and the step goes on. The shipped buffer
trains on the other three sessions of g00002 (seed 002's partial group, found in step 1 only); the patched one
refuses the group. Either way the following steps are unaffected: no step_* finding, every trajectory of steps 2
and 3 trained on. A clean run of the shipped buffer over 5 steps has no finding at all: step_resources judges
steps 1 to 4, three of them with Ray up (the last is measured after the teardown).

Each version runs in its own environment (`.targets/verl`, `.targets/verl-0.9`); one not built is skipped.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bench import RunConfig, RunResult, run
from bench.targets.frameworks.envs import environment_python
from faults import plan_from_specs
from tests.ray_helpers import ray_processes, worker_pid
from tests.test_target_verl import VERSIONS, version  # noqa: F401 - the fixture: one run per verl version

STEPS, CLEAN_STEPS, N = 4, 5, 8  # 2 groups of 4 per step
CRASH = "raise_after_generate:p=1,steps=1,trajectories=g00002-1"  # step 1 holds g00002 and g00003
SLEEP = ["/release_memory_occupation"]
SYNC = ["/resume_memory_occupation", "/update_weights_from_tensor", "/flush_cache", "/resume_memory_occupation"]
TRAINER_ROUTES = set(SLEEP + SYNC)


def _run(version: str, variant: str, faults: list[str], steps: int = STEPS) -> RunResult:
    plan = plan_from_specs(faults, 0) if faults else None
    config = RunConfig(trace="rlvr-500", plan=plan, target=f"verl:{variant}", n=N, steps=steps,
                       on_step_failure="continue", python=environment_python(VERSIONS[version]), watchdog_s=120.0,
                       time_scale=0.05)
    result = asyncio.run(run(config))
    print(f"verl {version} {variant} {faults}: {sorted(Counter((r.step, r.outcome) for r in result.records).items())}, "
          f"violations {Counter(v.invariant for v in result.violations)}")
    return result


@pytest.fixture(scope="module")
def clean(version: str) -> RunResult:
    return _run(version, "shipped", [], CLEAN_STEPS)


@pytest.fixture(scope="module")
def crashed_shipped(version: str) -> RunResult:
    return _run(version, "shipped", [CRASH])


@pytest.fixture(scope="module")
def crashed_patched(version: str) -> RunResult:
    return _run(version, "patched", [CRASH])


def _outcomes(result: RunResult, step: int) -> Counter[str]:
    return Counter(r.outcome for r in result.records if r.step == step)


def test_a_clean_run_keeps_one_runtime_and_finds_nothing(version: str, clean: RunResult) -> None:
    assert clean.violations == [], [v.message for v in clean.violations]
    rows = clean.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None] * CLEAN_STEPS
    assert [row["n_completed"] + row["n_truncated"] for row in rows] == [N] * CLEAN_STEPS
    # Ray's processes stay up between steps (the old one-step adapter had none left after every step) and go once,
    # with the last step
    children = [row["children"] for row in rows]
    assert all(count > 0 for count in children[:-1]) and children[-1] == 0, children
    assert ray_processes({worker_pid(clean)}) == []
    # the trainer's calls, in its order: asleep once built, then before each step its weight sync, and after each
    # step's sample (but the last, whose trainer ends) asleep again
    calls = [q.endpoint for q in clean.requests if q.endpoint in TRAINER_ROUTES]
    assert calls == SLEEP + SYNC + (SLEEP + SYNC) * (CLEAN_STEPS - 1)
    step_of = {r.trajectory: r.step for r in clean.records}
    synced = [q.started for q in clean.requests if q.endpoint == "/update_weights_from_tensor"]
    assert all(q.started > synced[step_of[q.trajectory]] for q in clean.requests if q.trajectory in step_of)
    # verl's sync names no version to SGLang: the server's stays "0"; the adapter says it published none
    assert [(row["published_by"], row["trainer_version"], row["versions_served"]) for row in rows] == [
        ("adapter", None, ["0"])] * CLEAN_STEPS
    if version == "0.9.1":  # its trainer sets its server actor's global_steps: step k is generated under k
        assert {r.step: {tuple(r.details["global_steps"])} for r in clean.records} == {
            k: {(k, k)} for k in range(CLEAN_STEPS)}


def test_the_shipped_buffer_trains_on_step_1s_partial_group_and_the_next_steps_run_clean(
        crashed_shipped: RunResult) -> None:
    result = crashed_shipped
    (event,) = result.fault_events
    assert (event.fault, event.trajectory) == ("raise_after_generate", "g00002-1")
    rows = result.steps["rows"]  # type: ignore[index]
    assert [row["error"] for row in rows] == [None] * STEPS  # verl's step goes on: the root ends `failure`
    assert _outcomes(result, 1) == Counter({"completed": 7, "lost": 1})  # g00002-1 has no row
    for step in (0, 2, 3):
        assert _outcomes(result, step)["lost"] == 0 and sum(_outcomes(result, step).values()) == N
    assert {v.invariant for v in result.violations} == {"group_completeness", "accounting"}
    (partial,) = [v for v in result.violations if v.invariant == "group_completeness"]
    assert (partial.evidence["group"], partial.evidence["missing"]) == ("g00002", ["g00002-1"])
    assert not [v for v in result.violations if v.invariant.startswith("step_")]
    assert result.steps["first_violation"]["step"] == 1  # type: ignore[index]
    assert ray_processes({worker_pid(result)}) == []


def test_the_patched_buffer_refuses_the_group_and_every_step_passes(crashed_patched: RunResult) -> None:
    result = crashed_patched
    assert result.violations == [], [v.message for v in result.violations]
    assert [e.reach for e in result.fault_events] == ["consumed"]  # the poison raised where verl scores the reply
    assert _outcomes(result, 1) == Counter({"completed": 4, "failed": 1, "dropped": 3})
    (failed,) = [r for r in result.records if r.outcome == "failed"]
    assert failed.trajectory == "g00002-1" and failed.error is not None and failed.error.type == "InjectedFault"
    assert {r.group for r in result.records if r.outcome == "dropped"} == {"g00002"}
    for step in (0, 2, 3):
        assert _outcomes(result, step)["completed"] + _outcomes(result, step)["truncated"] == N
    assert [row["error"] for row in result.steps["rows"]] == [None] * STEPS  # type: ignore[index]
    assert ray_processes({worker_pid(result)}) == []
