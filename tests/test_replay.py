"""Replay: clients that follow the trace turn by turn get the recorded answers, and are identified."""

from __future__ import annotations

import asyncio
import random
from array import array

import aiohttp
import pytest

from bench.replay.store import RecordedTrajectory
from bench.server import BenchServer

CLIENTS = 64


def _append_ids(trajectory: RecordedTrajectory, turn: int) -> list[int]:
    """Ids the recording appended before `turn` (tool outputs and chat markers)."""
    previous = trajectory.turns[turn - 1]
    start = previous.input_len + len(previous.output_ids)
    return list(array("i", trajectory.sequences[0][start * 4: trajectory.turns[turn].input_len * 4]))


async def _agent(http: aiohttp.ClientSession, url: str, group: list[RecordedTrajectory], prompt: list[int],
                 retry_turn: int | None, budget: int) -> list[tuple[str, int, list[int], list[float] | str]]:
    """Send turn 0, learn which member answered, then follow that member's recording.

    Like a real agent loop it clamps `max_new_tokens` to what is left of the context budget.
    """
    seen: list[tuple[str, int, list[int], list[float] | str]] = []
    context = list(prompt)
    trajectory: RecordedTrajectory | None = None
    turn = 0
    while True:
        max_new = max(1, min(2048, budget - len(context)))
        sampling = {"max_new_tokens": max_new, "stop_token_ids": [1758], "no_stop_trim": True}
        repeats = 2 if turn == retry_turn else 1
        for _ in range(repeats):
            async with http.post(f"{url}/generate", json={"input_ids": context, "sampling_params": sampling,
                                                          "return_logprob": True}) as reply:
                body = await reply.json()
        if "error" in body:
            seen.append((trajectory.id if trajectory else "?", turn, [], body["error"]["message"]))
            return seen
        triples = body["meta_info"]["output_token_logprobs"]
        output = [t[1] for t in triples]
        if trajectory is None:
            trajectory = next(m for m in group if list(m.turns[0].output_ids) == output)
        seen.append((trajectory.id, turn, output, [t[0] for t in triples]))
        turn += 1
        if turn == len(trajectory.turns):
            return seen
        context += output + _append_ids(trajectory, turn)


async def _run() -> None:
    async with BenchServer("agentic-500") as server:
        store = server.context.store
        groups = list(store.groups.values())[: CLIENTS // 4]
        jobs = []
        rng = random.Random(0)
        for group in groups:
            prompt = list(array("i", group.prompt))
            for member in group.members:
                jobs.append((group.members, prompt, 1 if member.member == 0 else None))
        rng.shuffle(jobs)
        assert len(jobs) == CLIENTS
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as http:
            budget = server.context.config.context_length
            results = await asyncio.gather(*(_agent(http, server.url, *job, budget) for job in jobs))
        claimed = [r[0][0] for r in results]
        assert sorted(claimed) == sorted(m.id for g in groups for m in g.members)  # each member exactly once
        for result in results:
            trajectory = store.by_id[result[0][0]]
            assert [turn for _, turn, _, _ in result] == list(range(len(trajectory.turns)))
            for _, turn, output, logprobs in result:
                recorded = trajectory.turns[turn]
                if recorded.error_status is not None:
                    assert logprobs == recorded.error_message
                else:
                    assert output == list(recorded.output_ids) and logprobs == list(recorded.logprobs)
        retried = {result[0][0] for result, job in zip(results, jobs) if job[2] is not None and len(result) > 1}
        assert retried
        log = server.log.records
        assert len(log) == sum(len(r) for r in results) + len(retried)
        assert all(r.drift is None for r in log)
        attempts: dict[tuple[str, int], list[int]] = {}
        for record in log:
            attempts.setdefault((record.trajectory, record.turn), []).append(record.attempt)
        for (trajectory_id, turn), numbers in attempts.items():
            expected = [1, 2] if turn == 1 and trajectory_id in retried else [1]
            assert sorted(numbers) == expected, (trajectory_id, turn, numbers)


def test_turn_by_turn_clients_get_the_recording_under_concurrency() -> None:
    asyncio.run(_run())


def test_a_store_of_some_groups_holds_them_as_the_full_store_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A repro loads only its trajectories' groups: same positions, members and sequences as a full load."""
    import gzip

    import pytest

    from bench.replay.store import TraceStore
    from bench.trace import TraceFormatError
    from bench.trace.shipped import shipped_trace

    path = shipped_trace("agentic-500")
    full = TraceStore.load(path)
    some = TraceStore.load(path, groups_of=["g00120-3", "g00009-0"])
    assert sorted(some.groups) == ["g00009", "g00120"]
    assert [t.id for t in some.trajectories] == [f"g00009-{m}" for m in range(4)] + [f"g00120-{m}" for m in range(4)]
    for trajectory in some.trajectories:
        assert trajectory == full.by_id[trajectory.id]  # index in the trace, member, packed sequences, turns
    with pytest.raises(KeyError, match="no trajectory g99999-0"):
        TraceStore.load(path, groups_of=["g00120-3", "g99999-0"])
    lines = gzip.open(path, "rb").read().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    lines[1] = lines[1].replace(b'"reward":', b'"reward":"high","recorded_reward":', 1)  # g00000-0, line 2
    broken.write_bytes(b"".join(lines))
    with pytest.raises(TraceFormatError, match=r"broken\.jsonl:2: reward"):
        TraceStore.load(broken, groups_of=["g00000-0"])  # a chosen group is checked as in a full load


def test_an_unnamed_resume_of_an_answer_siblings_start_alike_goes_to_the_member_that_was_aborted() -> None:
    """Two members whose recorded answers share their first token: a resume of that token, sent without a name,
    is the aborted member's (its answer counted failed), marked as told apart by order, never the other's."""
    from bench.replay import Identifier, TraceStore
    from bench.replay.store import pack
    from bench.trace.shipped import shipped_trace

    store = TraceStore.load(shipped_trace("rlvr-500"))
    group = next(g for g in store.groups.values()
                 if g.members[0].turns[0].output_ids[:1] == g.members[1].turns[0].output_ids[:1])
    first, second = group.members[0], group.members[1]
    identifier = Identifier(store)
    prompt = list(array("i", first.sequences[first.turns[0].sequence][: first.turns[0].input_len * 4]))
    claimed = [identifier.identify(pack(prompt)) for _ in group.members]  # the group's turn 0s, by arrival order
    assert [c.trajectory for c in claimed] == [m.id for m in group.members]
    identifier.record_outcome(claimed[1], succeeded=False)  # `second`'s answer was aborted after one token
    resumed = identifier.identify(pack(prompt + list(second.turns[0].output_ids[:1])))
    assert (resumed.trajectory, resumed.turn, resumed.attempt, resumed.resume) == (second.id, 0, 2, 1)
    assert resumed.drift is None and resumed.by_order
    named = identifier.identify(pack(prompt + list(first.turns[0].output_ids[:1])), hint=first.id)
    assert (named.trajectory, named.resume, named.by_order) == (first.id, 1, False)


def _mutated(record: dict, path: str, value: object) -> None:
    *parents, last = [int(p) if p.lstrip("-").isdigit() else p for p in path.split(".")]
    for key in parents:
        record = record[key]
    if value is _DELETE:
        del record[last]
    else:
        record[last] = value


_DELETE = object()


@pytest.mark.parametrize("edits", [
    [("prompt.ids.5", 10**6)],
    [("turns.1.response.output_ids.0", -1)],
    [("turns.2.request.input_ids_append.0", 2**40)],  # beyond int32: no overflow, the same message
    [("turns.-1.response.output_ids.-1", 1765)],  # the vocabulary's size: just outside
    [("turns.1.response.logprobs.0", 0.5), ("turns.1.request.input_ids_append.0", 1765)],  # the id is named first
    [("turns.1.request.input_ids_append", _DELETE), ("turns.1.request.text", "sent as text"),
     ("turns.2.request.input_ids_append.0", 10**6)],  # appended to a context not known as ids
], ids=["prompt", "negative output", "huge append", "vocab size", "two problems", "after a text turn"])
def test_the_store_rejects_an_id_outside_the_vocabulary_as_the_reader_does(tmp_path, edits) -> None:  # type: ignore[no-untyped-def]
    """The store checks token ids in bulk on the packed sequences, not list by list as the reader does: the
    error must be the same one, at the same line, whatever list holds the id."""
    import gzip
    import json

    from bench.replay.store import TraceStore
    from bench.trace import TraceFormatError, open_trace
    from bench.trace.shipped import shipped_trace

    lines = gzip.open(shipped_trace("agentic-500"), "rb").read().splitlines(keepends=True)[:6]
    original = lines[3]
    record = json.loads(original)
    assert len(record["turns"]) >= 3 and "input_ids_append" in record["turns"][1]["request"]
    for path, value in edits:
        _mutated(record, path, value)
    lines[3] = json.dumps(record).encode() + b"\n"
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"".join(lines))
    with pytest.raises(TraceFormatError) as by_reader:
        with open_trace(broken) as reader:
            list(reader)
    assert by_reader.value.problem.line == 4 and "outside the vocabulary" in by_reader.value.problem.message
    with pytest.raises(TraceFormatError) as by_store:
        TraceStore.load(broken)
    assert by_store.value.problem == by_reader.value.problem
    broken.write_bytes(b"".join(lines[:3] + [original] + lines[4:]))  # the same trace, well formed, loads
    assert len(TraceStore.load(broken).trajectories) == 5
