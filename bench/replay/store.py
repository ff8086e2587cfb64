"""The trace held in memory for serving: one token sequence per trajectory.

A multi-turn trajectory's requests are successive prefixes of one sequence (prompt,
turn 0's output, the ids appended before turn 1, turn 1's output, ...), so the store keeps
that sequence once, as packed int32 bytes, and each turn as offsets into it. Matching a
request is then a length check and one `memcmp`, and memory stays linear in the trace.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn

from bench.trace import TraceFormatError, TraceHeader, TraceReader, Trajectory, open_trace

from . import cache as trace_cache
from .cache import TraceCache, default_cache

INT32 = 4


def pack(ids: list[int]) -> bytes:
    """Token ids as packed int32 bytes (what sequences are compared as). The server packs every request's
    context (1,640 ids on average in agentic-500), twice: `struct` takes half the time `array` does. Whatever
    it refuses (an id that is no int32, or no int) goes through `array`, which raises what it always raised."""
    try:
        return _int32s(len(ids)).pack(*ids)
    except struct.error:
        return array("i", ids).tobytes()


@lru_cache(maxsize=4096)
def _int32s(count: int) -> struct.Struct:
    return struct.Struct(f"{count}i")  # native int, as array("i"): the same bytes


@dataclass(frozen=True)
class RecordedTurn:
    """One recorded answer and where its request sits in the trajectory's sequence."""

    sequence: int  # index into RecordedTrajectory.sequences
    input_len: int  # request = sequences[sequence][:input_len]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    text: str
    finish_reason: dict[str, Any] | None
    weight_version: str | None
    cached_tokens: int
    ttft: float
    total: float
    error_status: int | None
    error_message: str | None


@dataclass
class RecordedTrajectory:
    id: str
    group_id: str
    index: int  # position in the trace
    member: int  # position within its group
    prompt_len: int
    prompt_messages: list[dict[str, Any]] | None
    prompt_tools: list[dict[str, Any]] | None
    prompt_text: str
    first_sampling_params: dict[str, Any]  # what turn 0 asked for, for targets replaying the prompt
    sequences: list[bytes]
    turns: list[RecordedTurn]
    recorded_outcome: str | None = None  # the trace's `metadata.outcome` (e.g. context_overflow), if it says
    prompt_raw: str | None = None  # the raw prompt, when the framework renders `prompt_text` itself

    def request_matches(self, turn: int, packed: bytes) -> bool:
        recorded = self.turns[turn]
        if len(packed) != recorded.input_len * INT32:
            return False
        # `startswith` is one memcmp; comparing a memoryview slice walks it byte by byte (14 µs for 1,640 ids)
        return self.sequences[recorded.sequence].startswith(packed)


@dataclass
class Group:
    id: str
    prompt: bytes  # packed prompt ids, shared by every member
    members: list[RecordedTrajectory] = field(default_factory=list)


def _in_vocab(ids: list[int], vocab_size: int) -> bool:
    return not ids or (min(ids) >= 0 and max(ids) < vocab_size)


def _pack_in_vocab(sequence: list[int], vocab_size: int) -> bytes | None:
    """`pack(sequence)`, or None when an id is outside the vocabulary: one C pass packs (the trace's schema made
    them ints), min and max over the packed array are then nearly free (checking each id list with min() and
    max() cost as much as decoding the trace)."""
    import numpy

    try:
        packed = pack(sequence)
    except OverflowError:  # not an int32, so not in any vocabulary
        return None
    values = numpy.frombuffer(packed, dtype=numpy.int32)
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
        return None
    return packed


def _recorded(trajectory: Trajectory, index: int, member: int, vocab_size: int) -> RecordedTrajectory | None:
    """The trajectory as served, or None when a token id is outside the vocabulary (checked here, in bulk, on every
    id the trace holds: the prompt, each sequence, and appends to a context not known as ids)."""
    if not _in_vocab(trajectory.prompt.ids, vocab_size):
        return None
    sequences: list[list[int]] = []
    turns: list[RecordedTurn] = []
    current: list[int] | None = None
    # Whether the request context is known as ids (`Trajectory.iter_request_input_ids` yields ids, not None). While
    # it is, it equals `current` from turn 1 on, so an `input_ids_append` turn only extends `current`: no per-turn
    # copy or prefix comparison of the whole context (quadratic in turns on a long trajectory).
    known = True
    for step in trajectory.turns:
        request, response = step.request, step.response
        if request.input_ids_append is not None and request.input_ids is None and known and current is not None:
            current.extend(request.input_ids_append)
            input_len = len(current)
        else:
            if request.input_ids is not None:
                ids, known = request.input_ids, True
            elif request.input_ids_append is not None and known:
                ids = trajectory.prompt.ids + request.input_ids_append  # turn 0
            else:
                ids, known = [], False  # sent as text or messages: matched through their tokenization instead
                if request.input_ids_append is not None and not _in_vocab(request.input_ids_append, vocab_size):
                    return None  # appended to an unknown context: in no sequence
            if current is None or len(ids) < len(current) or ids[: len(current)] != current:
                current = list(ids)
                sequences.append(current)
            else:
                current.extend(ids[len(current):])
            input_len = len(ids)
        turns.append(RecordedTurn(
            sequence=len(sequences) - 1,
            input_len=input_len,
            output_ids=tuple(response.output_ids),
            logprobs=None if response.logprobs is None else tuple(response.logprobs),
            text=response.text,
            finish_reason=response.finish_reason,
            weight_version=response.weight_version,
            cached_tokens=response.cached_tokens,
            ttft=response.latency.ttft,
            total=response.latency.total,
            error_status=response.error.status if response.error else None,
            error_message=response.error.message if response.error else None,
        ))
        current.extend(response.output_ids)
    packed = [_pack_in_vocab(s, vocab_size) for s in sequences]
    if any(p is None for p in packed):
        return None
    return RecordedTrajectory(
        id=trajectory.id, group_id=trajectory.group_id, index=index, member=member,
        prompt_len=len(trajectory.prompt.ids), prompt_messages=trajectory.prompt.messages,
        prompt_tools=trajectory.prompt.tools, prompt_text=trajectory.prompt.text,
        first_sampling_params=trajectory.turns[0].request.sampling_params if trajectory.turns else {},
        sequences=packed, turns=turns, recorded_outcome=_outcome(trajectory),  # type: ignore[arg-type]  # no None
        prompt_raw=trajectory.prompt.raw,
    )


def _outcome(trajectory: Trajectory) -> str | None:
    outcome = trajectory.metadata.get("outcome")
    return None if outcome is None else str(outcome)


@dataclass
class TraceStore:
    """Every trajectory of a trace, by id and by group, ready to match requests against."""

    path: Path
    header: TraceHeader
    trajectories: list[RecordedTrajectory]
    by_id: dict[str, RecordedTrajectory]
    groups: dict[str, Group]

    @classmethod
    def load(cls, path: str | Path, *, groups_of: Collection[str] | None = None,
             cache: TraceCache | None | Literal["environment"] = "environment") -> "TraceStore":
        """The whole trace, checked; with `groups_of`, only the groups holding those trajectory ids (a repro
        replays one trajectory of a 500-trajectory trace: the rest is not decoded, checked or kept).

        `cache`: where a store loaded before is read back from, and a whole trace's store is kept after it loaded
        (`bench.replay.cache`; by default the one `ROLLOUT_BENCH_TRACE_CACHE` says, None: none)."""
        if cache == "environment":
            cache = default_cache()
        if cache is None:
            return cls._load(path, groups_of)
        try:
            key = trace_cache.file_key(Path(path))
        except OSError:
            return cls._load(path, groups_of)  # a missing file: the load says so, as it always did
        cached = trace_cache.read(cache, Path(path), key)
        if cached is not None:
            return cached if groups_of is None else cached.only_groups_of(groups_of)
        store = cls._load(path, groups_of)
        if groups_of is None:
            trace_cache.write(cache, store, key)
        return store

    def only_groups_of(self, wanted: Collection[str]) -> "TraceStore":
        """This store cut to the groups holding the `wanted` trajectory ids, as `load(groups_of=wanted)` makes it."""
        missing = sorted(set(wanted) - set(self.by_id))
        if missing:
            raise KeyError(f"trace {self.path}: no trajectory {', '.join(missing)}")
        keep = {self.by_id[t].group_id for t in wanted}
        trajectories = [t for t in self.trajectories if t.group_id in keep]
        return TraceStore(self.path, self.header, trajectories, {t.id: t for t in trajectories},
                          {g: group for g, group in self.groups.items() if g in keep})

    @classmethod
    def _load(cls, path: str | Path, groups_of: Collection[str] | None) -> "TraceStore":
        """`load` from the file itself: decoded, checked and packed."""
        trajectories: list[RecordedTrajectory] = []
        groups: dict[str, Group] = {}
        with open_trace(path) as reader:
            header = reader.header
            vocab_size = header.tokenizer.vocab_size
            chosen = _checked(reader) if groups_of is None else _groups_of(reader, set(groups_of))
            for index, number, trajectory in chosen:
                group = groups.get(trajectory.group_id)
                recorded = _recorded(trajectory, index, 0 if group is None else len(group.members), vocab_size)
                if recorded is None:  # an id outside the vocabulary: the full checks name the first problem
                    _raise_first_problem(reader, number, trajectory)
                if group is None:
                    group = groups[trajectory.group_id] = Group(trajectory.group_id, pack(trajectory.prompt.ids))
                group.members.append(recorded)
                trajectories.append(recorded)
        missing = sorted(set(groups_of or ()) - {t.id for t in trajectories})
        if missing:
            raise KeyError(f"trace {path}: no trajectory {', '.join(missing)}")
        return cls(Path(path), header, trajectories, {t.id: t for t in trajectories}, groups)


def _checked(reader: TraceReader) -> Iterator[tuple[int, int, Trajectory]]:
    """(position in the trace, line number, trajectory) of every line, checked as iterating the reader checks them
    (the first problem raises) except for the ids' vocabulary ranges, which `_recorded` checks in bulk."""
    for index, (number, line) in enumerate(reader.lines()):
        trajectory = reader.decode(number, line)
        if reader.problems(number, trajectory, id_ranges=False):
            _raise_first_problem(reader, number, trajectory)
        yield index, number, trajectory


def _raise_first_problem(reader: TraceReader, number: int, trajectory: Trajectory) -> NoReturn:
    """What iterating the reader raises for this line: its first problem, in the full checks' order."""
    for problem in reader.problems(number, trajectory):
        raise TraceFormatError(problem)
    raise AssertionError(f"line {number} has a problem the full checks do not find")


def _groups_of(reader: TraceReader, wanted: set[str]) -> Iterator[tuple[int, int, Trajectory]]:
    """(position in the trace, line number, trajectory) for every member of a group holding a wanted id, checked as a full
    load checks them; the other lines are told apart by their leading ids, not decoded."""
    lines: list[tuple[int, int, bytes, str]] = []
    keep: set[str] = set()
    for index, (number, line) in enumerate(reader.lines()):
        trajectory_id, group_id = reader.ids(number, line)
        if trajectory_id in wanted:
            keep.add(group_id)
        lines.append((index, number, line, group_id))
    for index, number, line, group_id in lines:
        if group_id in keep:
            trajectory = reader.decode(number, line)
            for problem in reader.problems(number, trajectory):
                raise TraceFormatError(problem)
            yield index, number, trajectory
