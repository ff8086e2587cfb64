"""The `prime-rl` target: prime-rl's real orchestrator `Scheduler` (a checkout) over a real verifiers env server,
against the bench server; seed 003 (prime-rl#2579 with verifiers#1427) before and after the fix.

prime-rl is not installable on CPU: these tests run when `ROLLOUT_BENCH_PRIME_RL_CHECKOUTS` names one or more
checkouts (separated by `:`; else `ROLLOUT_BENCH_PRIME_RL_PATH`, the target's own, names one) and its environment
is built (`make prime-rl-env`, or `ROLLOUT_BENCH_PRIME_RL_PYTHON`). The fixed scheduler needs verifiers#1427's flag:
`ROLLOUT_BENCH_PRIME_RL_VERIFIERS` names a verifiers checkout that has it (its tests skip without one), and
`ROLLOUT_BENCH_VERIFIERS_V1_SOURCE` a folder holding verifiers 0.4 (the unpacked wheel: it has only
`verifiers.v1`), which the adapter must refuse. Each prime-rl checkout is judged by what it contains: one whose
scheduler reschedules every errored group (before #2579) must churn through seed 003's outage
(`retry_discipline`); one with #2579 must fail fast with verifiers#1427, with no violation of any kind, and still
retry what is retryable. The options-and-errors tests need none of this.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import RunConfig, RunResult, run
from bench.isolation import TargetStartError
from bench.targets import resolve_target
from bench.targets.frameworks.checkout import CheckoutError
from bench.targets.frameworks.envs import target_python
from bench.targets.frameworks.prime_rl.target import MARKER, PATH_ENV, SCHEDULER, SCRATCH_PREFIX
from faults import Plan, plan_from_specs, resolve_plan
from tests.checkout_helpers import listed_checkouts, needs_checkouts

CHECKOUTS_ENV = "ROLLOUT_BENCH_PRIME_RL_CHECKOUTS"
CHECKOUTS = listed_checkouts(CHECKOUTS_ENV, PATH_ENV)
VERIFIERS_ENV = "ROLLOUT_BENCH_PRIME_RL_VERIFIERS"
VERIFIERS = Path(os.environ[VERIFIERS_ENV]) if os.environ.get(VERIFIERS_ENV) else None
V1_ENV = "ROLLOUT_BENCH_VERIFIERS_V1_SOURCE"
PYTHON = target_python("prime-rl")
needs_prime_rl = needs_checkouts("prime-rl", CHECKOUTS, PYTHON, CHECKOUTS_ENV, PATH_ENV, "make prime-rl-env")
N = 80  # 20 groups of 4: seed-003's 429 rule hits g00018-1, g00019-2 and g00019-3
RATE_LIMITED = {"g00018-1", "g00019-2", "g00019-3"}
NO_WORKERS = "No available workers (all circuits open or unhealthy)"


def _has_2579(checkout: Path) -> bool:
    """The scheduler fails the batch on a rollout error verifiers did not mark retryable."""
    return "is_reschedulable_rollout_error" in (checkout / SCHEDULER).read_text(encoding="utf-8")


def _has_1427(checkout: Path) -> bool:
    """verifiers writes `is_retryable` into the serialized rollout error."""
    return "is_retryable" in (checkout / "verifiers" / "types.py").read_text(encoding="utf-8")


def _run(source: Path, plan: Plan, **options: Any) -> RunResult:
    config = RunConfig(trace="rlvr-500", plan=plan, target="prime-rl", n=N, python=PYTHON, watchdog_s=120.0,
                       target_options={"source": str(source), **options})
    result = asyncio.run(run(config))
    print(f"{source} {options}: {Counter(r.outcome for r in result.records)}, "
          f"violations {Counter(v.invariant for v in result.violations)}, hang {result.hang}, "
          f"batch error {result.batch_error and result.batch_error.message[:160]}, requests {len(result.requests)}")
    return result


def _retry_plan() -> Plan:
    """seed-003 without its outage (its 429 on first attempts), and one empty reply: both retryable."""
    shipped = resolve_plan("seed-003")
    empty = plan_from_specs(["empty_completion:attempts=1,trajectories=g00001-1"], seed=shipped.seed)
    return Plan("seed-003-retryable", shipped.seed,
                (*(r for r in shipped.rules if r.name != "router-outage"), *empty.rules))


def _env_processes(result: RunResult) -> list[tuple[int, str]]:
    """Live processes of the run's env server: they keep its log folder, named after the worker's pid, open."""
    marker = f"{SCRATCH_PREFIX}{result.worker['pid']}-"  # type: ignore[index]
    leftovers = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            files = [f.path for f in process.open_files()]
        except (psutil.Error, OSError):
            continue
        if any(marker in f for f in files):
            leftovers.append((process.info["pid"], " ".join(process.info["cmdline"] or [])[:200]))
    return leftovers


def _requests_of(result: RunResult, trajectory: str) -> list[tuple[int, int]]:
    return [(r.attempt, r.status) for r in result.requests if r.trajectory == trajectory]


def test_a_run_needs_a_checkout_with_the_scheduler_and_known_options(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PATH_ENV, raising=False)
    target = resolve_target("prime-rl")
    assert (target.name, target.fail_fast) == ("prime-rl", False)  # declared from the checkout, in warm-up
    with pytest.raises(ValueError, match="--source DIR"):
        target.warm_up({})
    with pytest.raises(CheckoutError, match="no packages/prime-rl-configs/.*orchestrator.py there"):
        target.warm_up({"source": str(tmp_path)})
    (tmp_path / MARKER).parent.mkdir(parents=True)
    (tmp_path / MARKER).write_text("")
    with pytest.raises(CheckoutError, match="no src/prime_rl/orchestrator/scheduler.py.*#2639 replaced it"):
        target.warm_up({"source": str(tmp_path)})  # prime-rl from June 2026 on
    with pytest.raises(ValueError, match="unknown target option.*max_retry.*valid: source, verifiers_source"):
        target.warm_up({"source": str(tmp_path), "max_retry": 2})
    with pytest.raises(ValueError, match="max_redraws must be a whole number >= 0, not -1"):
        target.warm_up({"source": str(tmp_path), "max_redraws": -1})
    with pytest.raises(ValueError, match="no variants"):
        resolve_target("prime-rl:fixed")


def test_an_interpreter_without_verifiers_is_told_which_environment_to_build(tmp_path: Path,
                                                                              import_state: None) -> None:
    """The bench's own environment has no verifiers: the error names it and `make prime-rl-env`."""
    pytest.importorskip("msgspec")
    try:
        import verifiers  # noqa: F401
        pytest.skip("this interpreter has verifiers")
    except ImportError:
        pass
    (tmp_path / MARKER).parent.mkdir(parents=True)
    (tmp_path / MARKER).write_text("")
    (tmp_path / SCHEDULER).parent.mkdir(parents=True)
    (tmp_path / SCHEDULER).write_text("import verifiers\n")
    with pytest.raises(ModuleNotFoundError, match="imports .verifiers.*make prime-rl-env"):
        resolve_target("prime-rl").warm_up({"source": str(tmp_path)})


@needs_prime_rl
@pytest.mark.skipif(not os.environ.get(V1_ENV), reason=f"no verifiers 0.4 folder ({V1_ENV})")
def test_verifiers_0_4_is_refused_naming_the_v0_api_prime_rl_uses() -> None:
    """verifiers 0.4 ships only `verifiers.v1`: prime-rl's orchestrator imports `verifiers.serve` and uses
    `vf.ClientConfig`, `vf.RolloutOutput`..., so no prime-rl with this Scheduler can run on it."""
    with pytest.raises(TargetStartError, match=r"verifiers 0\.4\.0 .* lacks: ClientConfig.*verifiers\.serve"):
        _run(CHECKOUTS[0], resolve_plan("seed-003"), verifiers_source=os.environ[V1_ENV])


@needs_prime_rl
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_seed_003_churns_groups_before_2579_and_fails_fast_after(checkout: Path) -> None:
    options: dict[str, Any] = {}
    if _has_2579(checkout):
        if VERIFIERS is None or not _has_1427(VERIFIERS):
            pytest.skip(f"#2579 needs verifiers#1427's flag: name a checkout that has it in {VERIFIERS_ENV}")
        options["verifiers_source"] = str(VERIFIERS)
    result = _run(checkout, resolve_plan("seed-003"), **options)
    assert result.framework is not None and result.framework["source"] == str(checkout.resolve())
    assert result.framework["client_max_retries"] == "1"
    assert _env_processes(result) == []
    for trajectory in RATE_LIMITED:  # the 429 replaced the outage's answer on the first attempt
        assert _requests_of(result, trajectory)[0] == (1, 429)
    assert {e.trajectory for e in result.fault_events if e.fault == "http_error"} == RATE_LIMITED
    served = Counter(r.trajectory for r in result.requests if r.trajectory is not None)
    if _has_2579(checkout):
        assert result.violations == [] and result.hang is None
        assert result.batch_error is not None and result.batch_error.type == "RuntimeError"
        assert "Non-retryable rollout error" in result.batch_error.message and NO_WORKERS in result.batch_error.message
        assert max(served.values()) <= 2  # one group round: the request and the SDK's one retry
        failed = [r for r in result.records if r.outcome == "failed"]
        assert len(failed) == 4 and len({r.group for r in failed}) == 1  # the group the scheduler dropped
        assert all(r.details["error"]["is_retryable"] is False for r in failed)  # verifiers#1427's verdict
        assert Counter(r.outcome for r in result.records)["lost"] == N - 4
    else:
        assert result.batch_error is None and result.hang is None
        assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == N
        assert {v.invariant for v in result.violations} == {"retry_discipline"}  # no vacuity, nothing else
        churn = next(v for v in result.violations if v.trajectory is None)
        assert churn.message.startswith("batch retry storm")
        assert churn.evidence["resends"] > churn.evidence["allowed_resends"]
        assert churn.evidence["failed_resends"] > 10 * N  # replacement groups sent into the dead router
        attempts = {r.group: r.details["group_attempts"] for r in result.records}
        assert min(attempts.values()) > 3  # past prime-rl's 3 rounds: dropped, drawn again, failed again
        assert all(len(_requests_of(result, t)) > 2 and _requests_of(result, t)[-1][1] == 200 for t in RATE_LIMITED)


@needs_prime_rl
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=str)
def test_retryable_errors_are_still_retried(checkout: Path) -> None:
    """A 429 on first attempts (the SDK retries it) and an empty reply (verifiers' `InvalidModelResponseError`:
    #1427 marks it retryable, the scheduler replaces its group): every sample completes, with no violation."""
    if _has_2579(checkout) and (VERIFIERS is None or not _has_1427(VERIFIERS)):
        pytest.skip(f"#2579 needs verifiers#1427's flag: name a checkout that has it in {VERIFIERS_ENV}")
    options = {"verifiers_source": str(VERIFIERS)} if _has_2579(checkout) else {}
    result = _run(checkout, _retry_plan(), **options)
    assert result.violations == [] and result.batch_error is None and result.hang is None
    assert {r.outcome for r in result.records} <= {"completed", "truncated"} and len(result.records) == N
    for trajectory in RATE_LIMITED:
        assert _requests_of(result, trajectory) == [(1, 429), (2, 200)]
    attempts = {r.group: r.details["group_attempts"] for r in result.records}
    assert attempts.pop("g00001") == 2 and set(attempts.values()) == {1}
    assert [(e.fault, e.trajectory) for e in result.fault_events if e.fault == "empty_completion"] == [
        ("empty_completion", "g00001-1")]


@needs_prime_rl
def test_2579_without_1427_fails_fast_on_a_retryable_error_too() -> None:
    """verifiers 0.1.14 writes no `is_retryable`: #2579 then reads every error as terminal, the empty reply
    included (its own docstring's risk: 'can halt training runs if upstream retry flags are missing')."""
    fixed = [c for c in CHECKOUTS if _has_2579(c)]
    if not fixed:
        pytest.skip("no checkout with #2579 among " + ", ".join(map(str, CHECKOUTS)))
    result = _run(fixed[0], _retry_plan())
    assert result.framework is not None and result.framework["verifiers"] == "0.1.14"
    assert result.batch_error is not None and "EmptyModelResponseError" in result.batch_error.message
    failed = {r.trajectory: r for r in result.records if r.outcome == "failed"}
    assert set(failed) == {f"g00001-{m}" for m in range(4)}  # the dropped group, whole
    assert failed["g00001-1"].details["error"]["error"] == "EmptyModelResponseError"
    assert "is_retryable" not in failed["g00001-1"].details["error"]
    assert {failed[f"g00001-{m}"].status for m in (0, 2, 3)} == {"group dropped"}  # clean, thrown away with it
    assert result.violations == []  # failing closed on an injected fault is the declared policy, not a finding
