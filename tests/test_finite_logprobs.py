"""token_alignment's finite-logprob rule: a trained token whose logprob is NaN makes the batch's loss NaN."""

from __future__ import annotations

import asyncio

import pytest

from bench import RunConfig, run
from faults import plan_from_specs


@pytest.mark.parametrize("variant", ["unfixed", "fixed"])
def test_a_trained_nan_logprob_is_named_and_failing_the_sample_passes(variant: str) -> None:
    plan = plan_from_specs(["nan_logprob:p=1/4,position=2"], seed=5)
    result = asyncio.run(run(RunConfig(trace="rlvr-500", plan=plan, target=f"tests.nan_targets:TrainsOnServedLogprobs:"
                                       f"{variant}", n=24, isolation="inline")))
    hit = {e.trajectory for e in result.fault_events if e.fault == "nan_logprob"}
    assert 0 < len(hit) < 24
    if variant == "unfixed":
        assert {v.trajectory for v in result.violations} == hit
        assert all(v.invariant == "token_alignment" and v.evidence["positions"] == [2] and v.fault is not None
                   and v.fault["fault"] == "nan_logprob" for v in result.violations)
    else:
        assert result.violations == []
        assert {r.trajectory for r in result.records if r.outcome == "failed"} == hit
