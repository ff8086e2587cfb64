"""Real verl (PyPI 0.8.0 and 0.9.1): seed 002 (verl#6641, #6437) on its agent-loop rollout and replay buffer.

seed-002 answers 1 in 40 requests with HTTP 500 and resets 1 in 80 connections. On the first 200
trajectories of rlvr-500 (50 groups of 4, one turn each) that fails five agent loops in five groups. verl's
`_run_prompt` marks those roots `failure`; 0.8.0's `ReplayBuffer.sample()` ignores root statuses, and
0.9.1's sync buffer samples a `failure` root like a finished one: both hand the trainer the other three
sessions of each group. The `patched` variant refuses those groups. Each version runs in its own
environment (`.targets/verl`, `.targets/verl-0.9`); a version whose environment is not built is skipped.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench import RunConfig, RunResult, format_summary, run_blocking
from bench.report import write_report
from bench.targets.frameworks.envs import environment_python
from faults import plan_from_specs, resolve_plan
from tests.ray_helpers import ray_processes, worker_pid
from tests.seed_002_helpers import SEED_002_FAULTS, assert_partial_groups_named, faulted_groups

VERSIONS = {"0.8.0": "verl", "0.9.1": "verl-0.9"}  # verl version -> its environment folder
N = 200
PLAN_FAULTS = SEED_002_FAULTS


@pytest.fixture(scope="module", params=list(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    if environment_python(VERSIONS[request.param]) is None:
        pytest.skip(f"the verl {request.param} environment (.targets/{VERSIONS[request.param]}) is not built "
                    "(make targets)")
    return str(request.param)


def _run(version: str, variant: str) -> RunResult:
    return run_blocking(RunConfig(trace="rlvr-500", plan=resolve_plan("seed-002"), target=f"verl:{variant}", n=N,
                                  python=environment_python(VERSIONS[version])))


@pytest.fixture(scope="module")
def shipped(version: str) -> RunResult:
    return _run(version, "shipped")


@pytest.fixture(scope="module")
def patched(version: str) -> RunResult:
    return _run(version, "patched")


def test_both_variants_meet_the_same_faults_and_name_verls_version(version: str, shipped: RunResult,
                                                                    patched: RunResult) -> None:
    for result in (shipped, patched):
        assert {e.fault for e in result.fault_events} == PLAN_FAULTS
        assert 2 <= len(faulted_groups(result)) < N // 8
        assert result.batch_error is None and result.hang is None
        assert result.framework == {"framework": "verl", "version": version}
    assert faulted_groups(shipped) == faulted_groups(patched)


def test_shipped_buffer_trains_on_silently_partial_groups(shipped: RunResult, tmp_path: Path) -> None:
    faulted = faulted_groups(shipped)
    assert_partial_groups_named(shipped)
    lost = {r.trajectory for r in shipped.records if r.outcome == "lost"}
    assert lost == {t for members in faulted.values() for t in members}
    assert {v.invariant for v in shipped.violations} == {"group_completeness", "accounting"}
    # no crash: the summary says the work went to trajectories verl left out, not to a crash
    summary = write_report(shipped, tmp_path / "report")
    assert "sent for trajectories the target never gave back (answered or cut)" in format_summary(summary)
    # what verl did hand the trainer is exactly what the server served
    assert {r.trajectory for r in shipped.records if r.outcome != "lost"} == {
        t for t, verdict in shipped.provenance.items() if verdict.startswith("match")}


def test_patched_buffer_fails_closed_and_passes(patched: RunResult) -> None:
    assert patched.violations == [], [v.message for v in patched.violations]
    faulted = faulted_groups(patched)
    failed = {r.trajectory: r for r in patched.records if r.outcome == "failed"}
    assert set(failed) == {t for members in faulted.values() for t in members}
    for record in failed.values():  # the failed session names its own error: the server's answer, in verl's call
        assert record.error is not None and record.error.trajectory == record.trajectory
        assert record.error.type == "EngineRequestError" and record.trajectory in record.error.message
        assert any(cause in record.error.message for cause in ("500", "ServerDisconnectedError", "ClientOSError"))
        assert "llm_server.py" in record.error.traceback and "\x1b[" not in record.error.traceback
    dropped = [r for r in patched.records if r.outcome == "dropped"]
    assert {r.group for r in dropped} == set(faulted)
    assert all(r.error is not None and r.error.type == "IncompleteGroup" for r in dropped)
    assert len(patched.records) == N and not [r for r in patched.records if r.outcome == "lost"]


def test_no_ray_process_outlives_the_run(shipped: RunResult, patched: RunResult) -> None:
    """Ray ran in each run's worker (its session folder `/tmp/rb-ray-*`) and went with it."""
    assert ray_processes({worker_pid(shipped), worker_pid(patched)}) == []


def test_a_hung_step_is_a_liveness_finding_and_leaves_no_ray_behind() -> None:
    """One agent loop whose answer never comes: verl's `sample()` waits for its root forever. The watchdog
    names the hang, the worker is killed with its process group (Ray's processes in it), and the next run
    removes the session folder the killed one could not."""
    python = environment_python("verl") or environment_python("verl-0.9")
    if python is None:
        pytest.skip("no verl environment is built (make targets)")
    stall = plan_from_specs(["stall:p=1,trajectories=g00000-1"], seed=0)
    stalled = run_blocking(RunConfig(trace="rlvr-500", plan=stall, target="verl", n=8, watchdog_s=5.0, python=python))
    assert stalled.hang is not None and [v.invariant for v in stalled.violations] == ["liveness"]
    # its Ray workers, outside the killed process group, exit once they see their raylet gone
    deadline = time.monotonic() + 30
    while ray_processes({worker_pid(stalled)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_processes({worker_pid(stalled)}) == []
    left = set(Path("/tmp").glob("rb-ray-*"))
    clean = run_blocking(RunConfig(trace="rlvr-500", target="verl", n=4, python=python))
    assert clean.violations == [] and ray_processes({worker_pid(clean)}) == []
    assert not left & set(Path("/tmp").glob("rb-ray-*"))
