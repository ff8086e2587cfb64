"""The pytest plugin as a team uses it: only its public fixtures, markers and result objects.

This file is the README's example. It reproduces the seed-000 crash (slime#2078: one
agentic trajectory in 400 raises after generate() returns and a bare asyncio.gather loses
the batch) and shows the fixed group rollout passing under the same plan and seed.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

POISONED = "g00120-3"  # the trajectory seed-000 (seed 2) hits in agentic-500


@pytest.mark.bench_plan("seed-000")
def test_unfixed_gather_loses_the_batch(bench_run) -> None:
    result = bench_run("ref-gather:unfixed")
    assert result.seed == 2 and result.plan.name == "seed-000"
    assert result.violated == {"batch_survival"}
    (violation,) = result.violations
    assert violation.trajectory == POISONED and violation.evidence["error_type"] == "InjectedFault"
    assert result.outcomes["lost"] > 1  # the siblings in flight went down with it
    assert [(e.fault, e.trajectory) for e in result.fault_events] == [("raise_after_generate", POISONED)]
    assert result.repro_path is not None and result.repro_path.is_file()
    assert f'trajectories = ["{POISONED}"]' in result.repro_path.read_text()
    assert (result.report_dir / "summary.json").is_file() and (result.report_dir / "junit.xml").is_file()


@pytest.mark.bench_plan("seed-000")
def test_fixed_gather_keeps_an_aborted_placeholder(bench_run) -> None:
    result = bench_run("ref-gather:fixed")
    assert result.ok, result.explain()
    assert result.outcomes.get("aborted") == 1 and "lost" not in result.outcomes
    assert [e.trajectory for e in result.fault_events] == [POISONED]  # the fault fired: the pass means something
    assert result.repro_path is None


@pytest.mark.bench_trace("rlvr-500")
@pytest.mark.bench_plan("seed-000")
def test_own_client_against_the_server(bench_server) -> None:
    """Drive the server with any HTTP client; the plan applies and every firing is logged."""
    spec = bench_server.trajectories[0]
    body = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
    forced = urllib.request.Request(f"{bench_server.url}/generate", data=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json", "X-Bench-Fault": "missing_logprobs",
                                             "X-Bench-Trajectory": spec.id})
    with urllib.request.urlopen(forced, timeout=30) as reply:
        answer = json.load(reply)
    assert answer["meta_info"].get("output_token_logprobs") is None
    assert [(e.fault, e.trajectory, e.turn) for e in bench_server.fault_events] == [("missing_logprobs", spec.id, 0)]
    assert [r.trajectory for r in bench_server.requests] == [spec.id]
    assert bench_server.seed == 2
