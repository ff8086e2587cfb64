"""Real AReaL (PyPI `areal`, its remote SGLang engine and RLVR workflow) against the bench server."""

from __future__ import annotations

import pytest

from bench import RunConfig, run_blocking
from bench.targets.frameworks.envs import target_python
from faults import plan_from_specs, resolve_plan

AREAL_PYTHON = target_python("areal")
pytestmark = pytest.mark.skipif(AREAL_PYTHON is None, reason="the areal environment is not built (make targets)")


def _run(plan, n: int = 16):  # type: ignore[no-untyped-def]
    return run_blocking(RunConfig(trace="rlvr-500", target="areal", n=n, plan=plan, python=AREAL_PYTHON))


def test_areal_trains_on_exactly_what_it_was_served_and_the_report_names_its_version() -> None:
    result = _run(plan_from_specs(["latency:ms=1,p=1"], seed=0))
    assert result.violations == [], [v.message for v in result.violations]
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == 16
    assert set(result.provenance.values()) == {"match (tokens+logprobs)"}
    assert result.framework == {"framework": "areal", "version": "1.0.4"}
    assert all(r.response_ids and len(r.logprobs or []) == r.response_length for r in result.records)


def test_areal_drops_an_episode_without_logprobs_naming_the_keyerror() -> None:
    result = _run(plan_from_specs(["missing_logprobs:p=1,trajectories=g00000-1"], seed=0))
    (failed,) = [r for r in result.records if r.outcome == "failed"]
    assert failed.trajectory == "g00000-1" and failed.error is not None
    assert failed.error.type == "KeyError" and "output_token_logprobs" in failed.error.message
    assert "sglang_remote.py" in failed.error.traceback  # the line in AReaL that read the answer
    assert [v.invariant for v in result.violations] == []


def test_areal_keeps_retrying_the_routers_terminal_no_workers_answer() -> None:
    """Seed 003's outage on AReaL: its engine retries every error, the router's 'all circuits open' too."""
    result = _run(resolve_plan("seed-003"), n=8)
    storms = [v for v in result.violations if v.invariant == "retry_discipline"]
    assert storms and all(r.outcome == "failed" for r in result.records)
    assert any("kept retrying a terminal error" in v.message for v in storms)


def test_areal_retries_seed_002s_server_errors_and_resets_and_keeps_every_episode() -> None:
    """Seed 002 on AReaL: its engine retries the 500s and the dropped connection, so every episode trains."""
    result = _run(resolve_plan("seed-002"), n=200)
    hit = {e.trajectory for e in result.fault_events}
    assert {e.fault for e in result.fault_events} == {"http_error", "connection_reset"} and len(hit) >= 3
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == 200
    requests = {t: sum(q.trajectory == t for q in result.requests) for t in hit}
    assert all(count >= 2 for count in requests.values()), requests  # retried, not lucky
    assert result.violations == [], [v.message for v in result.violations]
