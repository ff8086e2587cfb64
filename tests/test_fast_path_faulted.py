"""A faulted plain request whose faults leave its body the saved one (`native._faulted_splice`) answers as the slow
path does: the same bytes but for the per-request fields, content type, request-log rows, served tokens and fault
events, for every fault that can leave it so, alone and together; a fault that changes the body still takes the
slow path."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from bench.server import PROFILES, native
from bench.server.app import create_app, load_context
from faults import plan_from_specs
from tests.server_helpers import turn_input
from tests.test_fast_path import _call, _log_row, _normal

TRACE = "retool-64"
TRAJECTORIES = 6  # their first two turns, each sent twice: the first attempt saves the reply, the retry is faulted

# (rules, whether the retry is spliced)
CASES = [
    (["stale_weight_version"], True),
    (["malformed_json"], True),
    (["wrong_content_type"], True),
    (["stream_cut", "stream_no_finish_reason"], True),  # a whole answer: no effect, but logged
    (["stale_weight_version", "malformed_json", "wrong_content_type"], True),
    (["missing_weight_version"], True),
    (["missing_weight_version", "stale_weight_version", "malformed_json"], True),
    (["missing_logprobs"], False),
    (["stale_weight_version", "abort"], False),
    (["truncated_body"], True),
]


async def _run(rules: list[str], fast: bool, profile: str | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """Each request's answer (or that the connection was dropped), every log row and every fault event."""
    specs = [f"{rule}:attempts=2" for rule in rules]  # a retry: its first attempt saved the reply
    ctx = load_context(TRACE, plan=plan_from_specs(specs, seed=3), **({"sglang_version": profile} if profile else {}))
    ctx.fast_path = fast
    app = create_app(ctx)
    app.freeze()  # as a running server's: aiohttp sends its (empty) prepare signal on a streamed (truncated) answer
    answers = []
    for trajectory in ctx.store.trajectories[:TRAJECTORIES]:
        for turn in range(min(2, len(trajectory.turns))):
            body = {"input_ids": turn_input(trajectory, turn), "return_logprob": True,
                    "sampling_params": dict(trajectory.first_sampling_params)}
            for _ in range(2):
                try:
                    answer = await _call(app, body, {"X-Bench-Trajectory": trajectory.id})
                except asyncio.CancelledError:  # dropped (truncated_body): the half sent is `send_body`'s
                    answers.append("dropped")
                    continue
                answers.append((answer.status, answer.content_type, _normal(answer.body, True)))
    rows = [_log_row(ctx, index, False) for index in range(len(ctx.log))]
    events = [(e.rule, e.fault, e.trajectory, e.turn, e.attempt, e.change) for e in ctx.faults.log.events]
    return answers, rows, events


def _count_splices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the answers `_faulted_splice` makes, and fix the clock for both paths: a cut body (malformed_json) ends
    where the body's length says, which its latency fields move."""
    calls: list[int] = []
    splice = native._faulted_splice

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await splice(*args, **kwargs)

    monkeypatch.setattr(native, "_faulted_splice", counted)
    monkeypatch.setattr(time, "time", lambda: 1_750_000_000.0)
    return calls


PROFILE_CASES = [(rules, spliced, profile) for rules, spliced in CASES[:1] + CASES[5:7] for profile in sorted(PROFILES)]


@pytest.mark.parametrize("rules,spliced,profile", [(r, s, None) for r, s in CASES] + PROFILE_CASES,
                         ids=["+".join(r) + (f"@{p}" if p else "") for r, _, p in
                              [(r, s, None) for r, s in CASES] + PROFILE_CASES])
def test_a_faulted_answer_spliced_into_the_saved_reply_is_the_slow_paths(rules: list[str], spliced: bool,
                                                                         profile: str | None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every profile: those without a `weight_version` field (0.4.10) have no version to report or leave out."""
    calls = _count_splices(monkeypatch)
    slow = asyncio.run(_run(rules, False, profile))
    assert not calls
    fast = asyncio.run(_run(rules, True, profile))
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    faulted = {(trajectory, turn, attempt) for _, _, trajectory, turn, attempt, _ in slow[2]}
    assert len(faulted) == len(slow[0]) // 2 and {attempt for *_, attempt in faulted} == {2}  # every retry, logged
    assert len(calls) == (len(faulted) if spliced else 0)


async def _paused_retry(rule: str, fast: bool) -> tuple[Any, ...]:
    """A trajectory's turn answered once, then its faulted retry sent while generation is paused (in place), and
    generation resumed: the answer, the log rows and the fault events."""
    ctx = load_context(TRACE, plan=plan_from_specs([f"{rule}:attempts=2"], seed=3))
    ctx.fast_path = fast
    app = create_app(ctx)
    app.freeze()
    trajectory = ctx.store.trajectories[0]
    body = {"input_ids": turn_input(trajectory, 0), "return_logprob": True,
            "sampling_params": dict(trajectory.first_sampling_params)}
    headers = {"X-Bench-Trajectory": trajectory.id}
    await _call(app, body, headers)
    ctx.state.pause("in_place")
    retry = asyncio.ensure_future(_call(app, body, headers))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not retry.done()  # waiting for generation to continue
    ctx.state.resume()
    answer = await retry
    rows = [_log_row(ctx, index, False) for index in range(len(ctx.log))]
    events = [(e.rule, e.fault, e.trajectory, e.turn, e.attempt, e.change) for e in ctx.faults.log.events]
    return (answer.status, answer.content_type, _normal(answer.body, True)), rows, events


@pytest.mark.parametrize("rule", ["stale_weight_version", "missing_weight_version"])
def test_a_spliceable_retry_while_generation_is_paused_waits_and_answers_as_the_slow_path(
        rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_splices(monkeypatch)
    slow = asyncio.run(_paused_retry(rule, False))
    fast = asyncio.run(_paused_retry(rule, True))
    assert calls == [1]
    assert fast == slow
    assert len(slow[2]) == 1
