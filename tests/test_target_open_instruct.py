"""The `open-instruct` target: open-instruct's real async GRPO data path (a checkout) against the bench server;
seed 001 (allenai/open-instruct#1738) before and after the fix, and the drop-without-replenish configuration
that #1738 refuses.

open-instruct is not on PyPI: these tests run when `ROLLOUT_BENCH_OPEN_INSTRUCT_CHECKOUTS` names one or more
checkouts (separated by `:`; else `ROLLOUT_BENCH_OPEN_INSTRUCT_PATH`, the target's own, names one) and its
environment is built (`make open-instruct-env`, or
`ROLLOUT_BENCH_OPEN_INSTRUCT_PYTHON`). Each checkout is judged by what it contains: one without
`max_result_age_steps` (before #1738) must break staleness on seed 001's plan, one with it must pass with no
violation of any kind. The options-and-errors tests need neither.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, RunResult, run
from bench.isolation import TargetStartError
from bench.targets import resolve_target
from bench.targets.frameworks.checkout import CheckoutError
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.open_instruct.target import MARKER, PATH_ENV
from faults import resolve_plan
from tests.checkout_helpers import listed_checkouts, needs_checkouts
from tests.ray_helpers import ray_processes, worker_pid

CHECKOUTS_ENV = "ROLLOUT_BENCH_OPEN_INSTRUCT_CHECKOUTS"
CHECKOUTS = listed_checkouts(CHECKOUTS_ENV, PATH_ENV)
PYTHON = target_python("open-instruct")
needs_open_instruct = needs_checkouts("open-instruct", CHECKOUTS, PYTHON, CHECKOUTS_ENV, PATH_ENV,
                                      "make open-instruct-env")
N = 256  # 64 groups of 4: enough prompts in flight that a held answer does not starve the trainer
OPTIONS = {"prompts_per_step": 4}  # async_steps 1: open-instruct's max_result_age_steps = the bench's bound 1


def _has_1738(checkout: Path) -> bool:
    return "max_result_age_steps" in (checkout / MARKER).read_text(encoding="utf-8")


def _run(source: Path, variant: str = "shipped", **options: Any) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=resolve_plan("seed-001"), target=f"open-instruct:{variant}", n=N,
                       python=PYTHON, watchdog_s=120.0,
                       target_options={"source": str(source), **OPTIONS, **options})
    result = asyncio.run(run(config))
    print(f"{source} {variant}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, hang {result.hang}, "
          f"batch error {result.batch_error}")
    return result


def test_a_run_needs_a_checkout_and_known_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PATH_ENV, raising=False)
    target = resolve_target("open-instruct")
    with pytest.raises(ValueError, match="--source DIR"):
        target.warm_up({})
    with pytest.raises(CheckoutError, match="no open_instruct/data_loader.py there"):
        target.warm_up({"source": str(tmp_path)})
    with pytest.raises(ValueError, match="unknown target option.*async_step.*valid: source, async_steps"):
        target.warm_up({"source": str(tmp_path), "async_step": 2})
    with pytest.raises(ValueError, match="prompts_per_step must be a whole number >= 1, not 0"):
        target.warm_up({"source": str(tmp_path), "prompts_per_step": 0})
    with pytest.raises(ValueError, match="variants shipped, no-replenish"):
        resolve_target("open-instruct:patched")


def test_an_interpreter_without_open_instructs_imports_is_told_which_environment_to_build(
        tmp_path: Path, import_state: None) -> None:
    """The bench's own environment has no torch: the error names the missing module and `make open-instruct-env`."""
    (tmp_path / "open_instruct").mkdir()
    (tmp_path / "open_instruct" / "__init__.py").write_text("")
    (tmp_path / MARKER).write_text("import torch\n")
    with pytest.raises(ModuleNotFoundError, match="imports 'torch'.*make open-instruct-env"):
        resolve_target("open-instruct").warm_up({"source": str(tmp_path)})


@needs_open_instruct
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_seed_001_stale_results_are_trained_on_before_1738_and_dropped_after(checkout: Path) -> None:
    result = _run(checkout)
    assert result.framework is not None and result.framework["source"] == str(checkout.resolve())
    stale_answers = [e for e in result.fault_events if e.fault == "stale_weight_version"]
    assert stale_answers and all(e.change.startswith("held until weight_version") for e in stale_answers)
    assert ray_processes({worker_pid(result)}) == []
    outcomes = Counter(r.outcome for r in result.records)
    if _has_1738(checkout):
        assert result.violations == [] and result.hang is None and result.batch_error is None
        dropped = [r for r in result.records if r.outcome == "dropped"]
        assert dropped and all(r.status == "STALE" for r in dropped)  # the held answers' groups
        assert outcomes["completed"] + outcomes["truncated"] + len(dropped) == N
    else:
        assert {v.invariant for v in result.violations} == {"staleness"}
        assert all(v.evidence["lag"] >= 2 and v.evidence["bound"] == 1 for v in result.violations)
        assert outcomes["dropped"] == 0


@needs_open_instruct
def test_two_async_steps_are_open_instructs_declared_tolerance_not_a_finding() -> None:
    """With `async_steps=2` open-instruct trains on results two policies behind by design: the adapter declares
    it and the run's staleness bound is 2 (a new user's false alarm on fixed code, with the bench's bound 1)."""
    fixed = [c for c in CHECKOUTS if _has_1738(c)]
    if not fixed:
        pytest.skip("no checkout with #1738 among " + ", ".join(map(str, CHECKOUTS)))
    result = _run(fixed[0], async_steps=2)
    assert result.config.bounds.max_weight_lag == 2 and result.framework["max_weight_lag"] == "2"
    assert result.violations == [] and any(r.outcome == "dropped" for r in result.records)


@needs_open_instruct
def test_dropping_without_replenishing_is_refused_by_1738_up_front() -> None:
    """#1738's guard: `max_result_age_steps` without replenishing is a ValueError before any result is taken
    (its review: dropping without replenishing drains the pipeline and hangs). Before #1738 there is nothing
    to drop with, and the adapter refuses the variant at start."""
    fixed = [c for c in CHECKOUTS if _has_1738(c)]
    if not fixed:
        pytest.skip("no checkout with #1738 among " + ", ".join(map(str, CHECKOUTS)))
    refused = _run(fixed[0], "no-replenish")
    assert refused.batch_error is not None and refused.batch_error.type == "ValueError"
    assert "requires replenish_prompts=True" in refused.batch_error.message
    assert "data_loader.py" in refused.batch_error.traceback
    assert [v.invariant for v in refused.violations] == ["batch_survival"]
    for unfixed in [c for c in CHECKOUTS if not _has_1738(c)][:1]:
        with pytest.raises(TargetStartError, match="has no max_result_age_steps"):
            _run(unfixed, "no-replenish")
