"""The `slime` target: real slime (a THUDM/slime checkout) run by the worker against the bench server;
seed 000 on its `generate_rollout`, unfixed and patched, train and eval; a user's generate and reward
functions plugged in by dotted path.

slime is not on PyPI: its tests run when `ROLLOUT_BENCH_SLIME_PATH` names a checkout (and an
environment with its dependencies exists: the slime one, else the miles one). The slime-specific
adapter lines that do not need slime itself (engine count, legacy generate calling convention, a
user's plug-ins, options) run against miles' rollout module, which kept slime's shape.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RolloutJob, RunConfig, RunResult, TrajectorySpec, run
from bench.targets import TargetError, resolve_target
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.slime.family import OptionError, build_args, check_options
from bench.targets.frameworks.slime.target import PATH_ENV, Slime, checkout
from faults import Plan, resolve_plan
from tests.slime_family_helpers import USER_REWARD

POISONED = "g00120-3"
SEED_000 = [f"g0012{g}-{m}" for g in (0, 1) for m in range(4)]
RLVR = [f"g0000{g}-{m}" for g in (0, 1) for m in range(4)]
USER_PLUGINS = {"custom_generate_function_path": "tests.slime_family_helpers.marking_generate",
                "custom_rm_path": "tests.slime_family_helpers.marked_reward"}


SLIME_PATH = os.environ.get(PATH_ENV)
SLIME_PYTHON = target_python("slime")  # or ROLLOUT_BENCH_SLIME_PYTHON
MILES_PYTHON = target_python("miles")
needs_slime = pytest.mark.skipif(SLIME_PATH is None or SLIME_PYTHON is None,
                                 reason=f"no slime checkout ({PATH_ENV}) or no environment to run it (make slime-env)")
needs_miles = pytest.mark.skipif(MILES_PYTHON is None, reason="the miles environment is not built (make targets)")


def _run(target: str, python: str | None, plan: Plan | None, trace: str, trajectories: list[str],
         **options: Any) -> RunResult:
    config = RunConfig(trace=trace, plan=plan, target=target, trajectories=trajectories, python=python,
                       watchdog_s=120.0, time_scale=0.05, target_options=options)
    result = asyncio.run(run(config))
    print(f"{target} {options}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, plan seed {plan and plan.seed}")
    return result


def _job(**options: Any) -> RolloutJob:
    spec = TrajectorySpec("g00000-0", "g00000", [1, 2, 3], "abc", None, None,
                          {"temperature": 1.0, "max_new_tokens": 64, "stop_token_ids": [7]}, 1)
    return RolloutJob("http://127.0.0.1:4321", [spec], 512, Path("/tokenizer"), 16, 3, [], options)


def test_slime_args_name_one_engine_and_the_bench_server() -> None:
    job = _job()
    args = build_args(job, Slime(), {})
    assert (args.sglang_router_ip, args.sglang_router_port, args.rollout_num_engines) == ("127.0.0.1", 4321, 1)
    assert (args.sglang_server_concurrency, args.rollout_max_response_len, args.rollout_stop_token_ids) == (16, 64, [7])
    assert args.rollout_max_context_len == 512 and args.hf_checkpoint == "/tokenizer"
    assert args.some_switch_nobody_set is None  # what an unset option reads as
    assert build_args(job, Slime(), {"args": {"rollout_max_context_len": None}}).rollout_max_context_len is None


def test_bad_options_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="unknown bogus"):
        check_options({"bogus": 1})
    with pytest.raises(OptionError, match="mode"):
        check_options({"mode": "serve"})
    with pytest.raises(OptionError, match="custom_rm_path"):
        check_options({"custom_rm_path": "no_dots"})
    with pytest.raises(OptionError, match="no slime/rollout/sglang_rollout.py"):
        checkout({"slime_path": str(tmp_path)})
    with pytest.raises(TargetError, match="variants unfixed and patched"):
        resolve_target("slime:repaired")
    assert resolve_target("miles:fixed").patched and resolve_target("slime:patched").name == "slime:patched"
    assert not resolve_target("miles").patched


@needs_miles
def test_slime_lines_drive_miles_slime_shaped_rollout_with_user_plugins() -> None:
    """The slime adapter's own lines on miles' rollout module: the user's legacy generate function (called with
    `evaluation`) and reward function both run for every sample, behind the bench's plug-ins."""
    result = _run("tests.slime_family_helpers:SlimeOnMiles", MILES_PYTHON, None, "rlvr-500", RLVR, **USER_PLUGINS)
    assert result.batch_error is None and result.violations == []
    assert {r.outcome for r in result.records} == {"completed"}
    assert {r.reward for r in result.records} == {USER_REWARD}
    assert {r.details["framework"] for r in result.records} == {"slime adapter on miles"}


@needs_slime
def test_seed000_slime_train_crashes_with_its_root_cause() -> None:
    result = _run("slime", SLIME_PYTHON, resolve_plan("seed-000"), "agentic-500", SEED_000, slime_path=SLIME_PATH)
    assert [(e.trajectory, e.turn) for e in result.fault_events] == [(POISONED, 0)]
    assert result.batch_error is not None and result.batch_error.type == "InjectedFault"
    assert "generate_and_rm_group" in result.batch_error.traceback
    assert {r.outcome for r in result.records} == {"lost"}
    assert [v.trajectory for v in result.violations if v.invariant == "batch_survival"] == [POISONED]


@needs_slime
def test_seed000_slime_patched_keeps_one_aborted_placeholder() -> None:
    result = _run("slime:patched", SLIME_PYTHON, resolve_plan("seed-000"), "agentic-500", SEED_000,
                  slime_path=SLIME_PATH)
    assert result.batch_error is None and result.violations == []
    aborted = [r for r in result.records if r.outcome == "aborted"]
    assert [r.trajectory for r in aborted] == [POISONED]
    assert aborted[0].loss_mask == [0] and aborted[0].reward == 0.0 and aborted[0].error.type == "InjectedFault"
    assert Counter(r.outcome for r in result.records)["completed"] == len(SEED_000) - 1


@needs_slime
def test_seed000_slime_eval_crashes() -> None:
    result = _run("slime", SLIME_PYTHON, resolve_plan("seed-000"), "agentic-500", SEED_000[:4], mode="eval",
                  slime_path=SLIME_PATH)
    assert result.batch_error is not None and result.batch_error.type == "InjectedFault"
    assert "eval_rollout" in result.batch_error.traceback


@needs_slime
def test_slime_with_user_plugins() -> None:
    result = _run("slime", SLIME_PYTHON, None, "rlvr-500", RLVR, slime_path=SLIME_PATH, **USER_PLUGINS)
    assert result.batch_error is None and result.violations == []
    assert {r.reward for r in result.records} == {USER_REWARD}
    assert all(r.details["framework"].startswith("slime ") and f"(source {Path(SLIME_PATH).resolve()})"
               in r.details["framework"] for r in result.records)  # `slime <commit> (source ...)` in a git work tree


@needs_slime
def test_seed004_on_slime_single_turn_generate() -> None:
    """seed-004 through slime's own (single-turn) generate: slime ships no multi-turn tool generator in its
    package, so the tool-output rule cannot fire (vacuity says so); the abort and missing-logprob rules do."""
    first_groups = [f"g{g:05d}-{m}" for g in range(12) for m in range(4)]
    result = _run("slime", SLIME_PYTHON, resolve_plan("seed-004"), "agentic-500", first_groups, slime_path=SLIME_PATH)
    fired = Counter(e.fault for e in result.fault_events)
    assert fired["abort"] >= 1 and fired["missing_logprobs"] >= 1 and fired["oversized_tool_output"] == 0
    aborted = {r.trajectory for r in result.records if r.outcome == "aborted"}
    broken = {v.trajectory for v in result.violations if v.invariant == "abort_contract"}
    assert aborted and broken and broken <= aborted  # slime's aborted samples keep their loss mask
    assert "huge-tool-output" in " ".join(v.message for v in result.violations if v.invariant == "vacuity")
