"""A framework's declared staleness tolerance (`max_weight_lag` in its `framework_info()`) widens the run's bound:
open-instruct with `async_steps=2` trains on results two policies behind by design, and that is not a finding. A
stricter one (AReaL's synchronous 0) narrows the bench's default bound, never one the run was given wider."""

from __future__ import annotations

import asyncio

import pytest

from bench import Emit, RolloutJob, RunConfig, SampleRecord, run
from bench.invariants import Bounds
from bench.orchestration.runner import declared_bounds


class TwoBehind:
    """Trains on one sample of policy 2, then one of policy 0: the second lags two versions."""

    name = "two-behind"
    fail_fast = False

    def __init__(self, declared: str | None = None) -> None:
        self.declared = declared

    def framework_info(self) -> dict[str, str]:
        return {"framework": "two-behind"} | ({"max_weight_lag": self.declared} if self.declared else {})

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for spec, version in zip(job.trajectories, ("2", "0")):
            emit(SampleRecord(spec.id, spec.group, "completed", status="stop", prompt_length=len(spec.prompt_ids),
                              weight_versions=[version]))


def _staleness(declared: str | None, bounds: Bounds = Bounds()) -> list[int]:
    """The lags staleness flags when the plug-in (its variant: the declaration) runs under `bounds`."""
    target = "tests.test_declared_bounds:TwoBehind" + (f":{declared}" if declared else "")
    config = RunConfig(trace="rlvr-500", target=target, n=2, isolation="inline", invariants=["staleness"],
                       bounds=bounds)
    result = asyncio.run(run(config))
    assert result.config.bounds.max_weight_lag == declared_bounds(bounds, {"max_weight_lag": declared or ""}) \
        .max_weight_lag
    return [v.evidence["lag"] for v in result.violations]


@pytest.mark.parametrize("declared, lags", [(None, [2]), ("1", [2]), ("2", []), ("3", [])])
def test_the_declared_tolerance_widens_the_bound(declared: str | None, lags: list[int]) -> None:
    assert _staleness(declared) == lags


def test_a_stricter_declaration_narrows_only_the_default_bound() -> None:
    """AReaL at its default `max_head_offpolicyness` 0 declares 0: the bench's default 1 would let a sample one
    version behind through, which a synchronous AReaL never trains on; a wider bound the run was given stays."""
    assert declared_bounds(Bounds(), {"max_weight_lag": "0"}).max_weight_lag == 0
    assert declared_bounds(Bounds(max_weight_lag=2), {"max_weight_lag": "0"}).max_weight_lag == 2
    assert _staleness("0", Bounds(max_weight_lag=3)) == []  # the wider given bound stays: lag 2 passes


def test_a_wider_bound_given_to_the_run_stays() -> None:
    assert _staleness("1", Bounds(max_weight_lag=2)) == []
    assert declared_bounds(Bounds(max_weight_lag=3), {"max_weight_lag": "2"}).max_weight_lag == 3
    assert declared_bounds(Bounds(), {"max_weight_lag": "many"}) == Bounds()
