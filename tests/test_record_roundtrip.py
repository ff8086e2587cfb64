"""Round trip: a shipped trace served by the mock, recorded through `record` in front of the real sglang-router
while a real target runs, then replayed from the recording: the same trajectories, turns, ids and logprobs,
and zero drift."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.capture.parse import GENERATION_PATHS
from bench.capture.serve_recorder import RecordingProxy
from bench.orchestration.runner import RunConfig, _spec, run_blocking
from bench.records.sample import SampleRecord
from bench.server import ServerThread
from bench.targets import resolve_target
from bench.targets.base import RolloutJob
from bench.tokenizer import tokenizer_path
from bench.trace import Trajectory, open_trace, validate_trace
from tests.router_helpers import real_router


def _trajectories(path: str | Path, n: int | None = None) -> list[Trajectory]:
    with open_trace(path) as reader:
        found = list(reader)
    return found[:n] if n is not None else found


def _turns(trajectory: Trajectory) -> list[tuple[Any, ...]]:
    """Per turn: its whole input, the answer's ids, logprobs and finish."""
    return [(tuple(ids or ()), tuple(turn.response.output_ids), tuple(turn.response.logprobs or ()),
             (turn.response.finish_reason or {}).get("type"))
            for turn, ids in zip(trajectory.turns, trajectory.iter_request_input_ids())]


def _assert_recorded_what_was_served(recorded: list[Trajectory], originals: list[Trajectory], served: int,
                                     refused: int = 0) -> None:
    """Every answer the mock served is in the recording, in the trajectory and turn it belongs to, unchanged.

    Members of a group send identical first requests and the mock tells them apart by arrival order, which a
    router reorders: a member may be served another member's answers (and a target that caps turns by its own
    trajectory stop early). So each recorded turn is checked against the same turn of its group's members."""
    assert sum(len(t.turns) for t in recorded) == served
    assert sum(turn.response.error is not None for t in recorded for turn in t.turns) == refused
    by_prompt: dict[tuple[int, ...], list[Trajectory]] = {}
    for original in originals:
        by_prompt.setdefault(tuple(original.prompt.ids), []).append(original)
    for trajectory in recorded:
        members = by_prompt[tuple(trajectory.prompt.ids)]
        for index, turn in enumerate(_turns(trajectory)):
            if trajectory.turns[index].response.error is not None:
                continue  # the mock refused what the target asked (counted against its log below)
            assert any(index < len(m.turns) and _turns(m)[index] == turn for m in members), (trajectory.id, index)
    assert len({t.group_id for t in recorded}) == len(by_prompt)


async def _record_run(target_spec: str, trace: str, n: int, folder: Path, concurrency: int,
                      python: str | None = None, router: bool = True
                      ) -> tuple[Path, list[SampleRecord], list[Trajectory], int, int]:
    """Run the target on the trace's first n trajectories against record -> router -> mock (or record -> mock);
    the recording."""
    records: list[SampleRecord] = []
    with ServerThread(trace) as mock, contextlib.ExitStack() as stack:
        router_url = stack.enter_context(real_router([mock.url], folder))[0] if router else mock.url
        store = mock.context.store
        specs = [_spec(t) for t in store.trajectories[:n]]
        mock.context.identifier.dispatched = frozenset(s.id for s in specs)
        proxy = RecordingProxy(router_url, folder / "recorded.jsonl", tokenizer_dir=str(tokenizer_path()))
        url = await proxy.start()
        try:
            job = RolloutJob(url, specs, store.header.context_length, tokenizer_path(), concurrency, 0, [],
                             {"trace": str(store.path)})
            if python is None:
                target = resolve_target(target_spec)
            else:
                from bench.isolation.process import IsolatedTarget
                target = IsolatedTarget(target_spec, python)
            prepare = getattr(target, "prepare", None)
            if prepare is not None:
                await asyncio.to_thread(prepare, job)
            await target.run(job, records.append)
        finally:
            path = await proxy.stop()
        originals = [t for t in _trajectories(store.path) if t.id in {s.id for s in specs}]
        answered = [r for r in mock.context.log.records if r.endpoint in GENERATION_PATHS]
        served = len(answered)
        refused = sum((r.status or 0) >= 400 for r in answered)
    return path, records, originals, served, refused


def _check_round_trip(path: Path, originals: list[Trajectory], served: int, target_spec: str, concurrency: int,
                      python: str | None, refused: int = 0) -> None:
    assert [p.message for p in validate_trace(path)] == []
    recorded = _trajectories(path)
    assert len(recorded) == len(originals)
    _assert_recorded_what_was_served(recorded, originals, served, refused)

    result = run_blocking(RunConfig(trace=str(path), target=target_spec, plan=None, concurrency=concurrency,
                                    isolation="process" if python else "inline", python=python))
    generations = [r for r in result.requests if r.endpoint in GENERATION_PATHS]
    assert generations and all(r.trajectory is not None and r.drift is None for r in generations)
    replayed = Counter((r.trajectory, r.turn) for r in generations)
    assert replayed == Counter((t.id, k) for t in recorded for k in range(len(t.turns)))  # each turn, once
    # clean, but for the requests the mock refused while recording: a target that asked past the context then
    # (verifiers: 2048 new tokens late in a long agentic trajectory) does again in the replay, and is told so
    found = [(v.invariant, v.message) for v in result.violations]
    assert [i for i, _ in found] == ["context_budget"] * refused, found


@pytest.mark.slow
def test_multi_turn_reference_target_round_trips_through_the_real_router(tmp_path: Path) -> None:
    """One request at a time: members of a group send identical first requests, which the mock assigns to
    members in arrival order; the tool loop caps a trajectory's turns by its own recording, so a member served
    another's answers drifts from the trace. In order, the traffic is the trace's (and the recorder's placing of
    concurrent identical requests is the miles test's and the tracker tests' subject)."""
    target = "ref-tool-loop:fixed"
    path, samples, originals, served, refused = asyncio.run(_record_run(target, "agentic-500", 24, tmp_path, 1))
    assert served > 24 * 3  # multi-turn: later turns extend earlier ones
    assert len(samples) == 24 and all(s.outcome in ("completed", "truncated") for s in samples)
    _check_round_trip(path, originals, served, target, 1, None, refused)


@pytest.mark.slow
def test_miles_round_trips_through_the_real_router(tmp_path: Path) -> None:
    from bench.targets.frameworks.envs import target_python

    python = target_python("miles")
    if python is None:
        pytest.skip("the miles environment is not built (make targets): the miles round trip did not run")
    path, samples, originals, served, refused = asyncio.run(_record_run("miles", "rlvr-500", 32, tmp_path, 16, python))
    assert len(samples) == 32 and served == 32
    _check_round_trip(path, originals, served, "miles", 16, python, refused)


@pytest.mark.slow
def test_a_recording_in_another_tokenizer_replays_with_that_tokenizer(tmp_path: Path) -> None:
    """A real model's recording names its own tokenizer: the mock serves it, and the target loads it, from the
    local folder given (here a copy of the bench's tokenizer under another name: not recognised as the bench's)."""
    import shutil

    from bench.targets.frameworks.envs import target_python

    python = target_python("miles")
    if python is None:
        pytest.skip("the miles environment is not built (make targets): the foreign-tokenizer replay did not run")
    folder = tmp_path / "model-tokenizer"
    shutil.copytree(tokenizer_path(), folder)

    async def record() -> tuple[Path, list[Trajectory]]:
        with ServerThread("rlvr-500") as mock:
            proxy = RecordingProxy(mock.url, tmp_path / "foreign.jsonl", tokenizer_dir=str(folder))
            url = await proxy.start()
            store = mock.context.store
            specs = [_spec(t) for t in store.trajectories[:8]]
            mock.context.identifier.dispatched = frozenset(s.id for s in specs)
            try:
                from bench.isolation.process import IsolatedTarget
                job = RolloutJob(url, specs, store.header.context_length, folder, 8, 0, [], {"trace": str(store.path)})
                await IsolatedTarget("miles", python).run(job, lambda record: None)
            finally:
                path = await proxy.stop()
            return path, [t for t in _trajectories(store.path) if t.id in {s.id for s in specs}]

    path, originals = asyncio.run(record())
    with open_trace(path) as reader:
        assert reader.header.tokenizer.name == str(folder)
    assert [p.message for p in validate_trace(path)] == []
    _assert_recorded_what_was_served(_trajectories(path), originals, 8)
    with pytest.raises(ValueError, match="--tokenizer DIR"):
        run_blocking(RunConfig(trace=str(path), target="ref-gather:fixed", plan=None, isolation="inline"))
    result = run_blocking(RunConfig(trace=str(path), target="miles", plan=None, python=python,
                                    tokenizer_dir=str(folder)))
    generations = [r for r in result.requests if r.endpoint in GENERATION_PATHS]
    assert len(generations) == 8 and all(r.trajectory is not None and r.drift is None for r in generations)
    assert result.violations == [], [(v.invariant, v.message) for v in result.violations]


@pytest.mark.slow
def test_verifiers_chat_traffic_round_trips(tmp_path: Path) -> None:
    """The OpenAI chat path: real verifiers (chat completions with token ids) recorded, then replayed with zero drift.
    Without the router: sglang-router 0.3.2 drops vLLM's `return_token_ids` from chat requests, so behind it an
    engine's chat answers carry no ids (a recording then has only texts, noted)."""
    from bench.targets.frameworks.envs import target_python

    python = target_python("verifiers")
    if python is None:
        pytest.skip("the verifiers environment is not built (make targets): the chat round trip did not run")
    path, samples, originals, served, refused = asyncio.run(_record_run("verifiers", "agentic-500", 8, tmp_path, 1, python,
                                                                       router=False))
    assert served > 8 and len(samples) == 8
    with open_trace(path) as reader:
        recorded = list(reader)
    assert all(t.turns[0].request.endpoint == "/v1/chat/completions" and t.prompt.messages for t in recorded)
    _check_round_trip(path, originals, served, "verifiers", 1, python, refused)
