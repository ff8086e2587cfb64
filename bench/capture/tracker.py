"""Trajectories rebuilt from live traffic, where requests carry no trajectory id.

The rules (the same for the recorder and the fault proxy):
- a request whose input extends a trajectory's last input plus its output is that trajectory's next turn
  (the longest such context wins: members of a group share the prompt, not their outputs);
- a request that repeats a trajectory's last input after that attempt failed (an HTTP error, an abort) is the
  same turn's next attempt; a repeat after a success is too, unless another member's context is extended by it
  (under greedy decoding, members' next inputs can be identical: each is its own member's next turn);
- a request that repeats a group's prompt while the other members are in flight or done is a new member:
  identical turn-0 inputs form a group (GRPO's n samples of one prompt);
- anything else starts a new group.

Inputs are compared as byte strings (`ids_key`, `text_key`, `chat_key`), so one `startswith` is a token-aligned
prefix test. Trajectory ids are a digest of the group's prompt plus the member's arrival order: the same traffic
gives the same ids in every recording. `known_groups` (a trace's prompts) makes them the trace's own ids.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable

import msgspec

BUCKET_BYTES = 128  # prompts are bucketed by their first 128 bytes (16 token ids)
FAILED = ("error", "abort")


def ids_key(ids: Iterable[int]) -> bytes:
    return b"I" + array("q", ids).tobytes()  # 64-bit: any id a client may send


def text_key(text: str) -> bytes:
    return b"T" + text.encode("utf-8")


_canonical = msgspec.json.Encoder(order="sorted").encode


def chat_message_key(role: str, content: Any) -> bytes:
    """A chat message as the tracker compares it: role and text content only (clients re-serialize the rest)."""
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return _canonical([role, content or ""]) + b"\x1e"


def chat_key(messages: list[dict[str, Any]]) -> bytes:
    return b"C" + b"".join(chat_message_key(str(m.get("role")), m.get("content")) for m in messages)


def key_ids(key: bytes) -> list[int]:
    """The token ids of an `ids_key` (or of a tail cut from one at a token boundary, without the tag)."""
    body = key[1:] if key[:1] == b"I" else key
    return array("q", body).tolist()


@dataclass(frozen=True)
class KnownGroup:
    """A trace's group: its id and its members' ids and trace positions, in trace order."""

    id: str
    members: tuple[str, ...]
    indexes: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """What a request was taken to be."""

    trajectory: str
    group: str
    turn: int
    attempt: int  # 0 for a turn's first attempt
    index: int  # the trajectory's position: in the trace when known, else in order of first arrival
    member: int  # order within its group
    append: bytes  # the input after the previous turn's context (after the tag byte for ids); b"" on turn 0
    kind: str  # "new" | "turn" | "retry"
    known: bool  # the trajectory is one of `known_groups`' members


@dataclass
class _Trajectory:
    id: str
    group: "_Group"
    index: int
    member: int
    known: bool
    inputs: list[bytes] = field(default_factory=list)
    appends: list[bytes] = field(default_factory=list)  # each turn's input after the previous turn's context
    attempts: list[int] = field(default_factory=list)
    context: bytes = b""  # the last input plus its output once settled
    outcome: str | None = None  # the last attempt's outcome; None while it is in flight


@dataclass
class _Group:
    id: str
    prompt: bytes
    known: KnownGroup | None
    members: list[_Trajectory] = field(default_factory=list)


class TrafficTracker:
    """Places each request in a trajectory; `settle` tells it how the attempt ended."""

    def __init__(self, known_groups: dict[bytes, KnownGroup] | None = None) -> None:
        self._known = dict(known_groups or {})
        self._groups: dict[bytes, _Group] = {}
        self._buckets: dict[bytes, list[_Group]] = {}
        self._by_id: dict[str, _Trajectory] = {}
        self._created = 0
        self._next_index = max((i for g in self._known.values() for i in g.indexes), default=-1) + 1

    def place(self, key: bytes, hint: str | None = None) -> Placement:
        """`hint`: the trajectory the request names (the bench's `X-Bench-Trajectory` header, a `rid`), if any; it
        decides where the request fits its trajectory, so identical inputs are placed the same at any arrival
        order (the fault proxy's schedules depend on it). A hint that does not fit is ignored."""
        if hint is not None:
            hinted = self._hinted(key, hint)
            if hinted is not None:
                return hinted
        group = self._groups.get(key)
        if group is not None:  # the exact prompt of a group: a retry of a failed turn 0, else a new member
            retry = next((t for t in group.members if len(t.inputs) == 1 and t.outcome in FAILED), None)
            if retry is not None:
                return self._retry(retry)
            return self._new_member(group)
        best: _Trajectory | None = None
        resent: _Trajectory | None = None  # a later turn sent again after it succeeded
        for candidate in self._candidates(key):
            for member in candidate.members:
                if member.outcome is None:
                    continue  # in flight: its next turn cannot have been sent yet
                if member.inputs[-1] == key and member.outcome in FAILED:
                    return self._retry(member)
                if member.inputs[-1] == key and len(member.inputs) > 1:
                    resent = resent or member
                elif key.startswith(member.context) and (best is None or len(member.context) > len(best.context)):
                    best = member
        if best is not None:
            return self._next_turn(best, key)
        if resent is not None:
            return self._retry(resent)
        return self._new_member(self._new_group(key))

    def settle(self, placement: Placement, output: bytes, outcome: str) -> None:
        """The attempt ended: `output` is its output in the key's form without the tag (b"" for an error)."""
        trajectory = self._by_id[placement.trajectory]
        if placement.turn != len(trajectory.inputs) - 1 or placement.attempt != trajectory.attempts[-1]:
            return  # a later attempt or turn has been placed since: it is the one that counts
        trajectory.outcome = outcome
        trajectory.context = trajectory.inputs[-1] + (b"" if outcome == "error" else output)

    def group_prompt(self, placement: Placement) -> bytes:
        return self._by_id[placement.trajectory].group.prompt

    # -- placing ------------------------------------------------------------------------------
    def _hinted(self, key: bytes, hint: str) -> Placement | None:
        trajectory = self._by_id.get(hint)
        if trajectory is not None:
            if trajectory.outcome is None:
                return None  # in flight: this cannot be its next request
            if key == trajectory.inputs[-1]:
                return self._retry(trajectory)
            return self._next_turn(trajectory, key) if key.startswith(trajectory.context) else None
        group = self._groups.get(key)
        known = self._known.get(key)
        if known is None or hint not in known.members:
            return None
        return self._new_member(group or self._new_group(key), known.members.index(hint))

    def _candidates(self, key: bytes) -> list[_Group]:
        found = list(self._buckets.get(key[:BUCKET_BYTES], ()))
        for length in range(1, min(len(key), BUCKET_BYTES)):  # prompts shorter than a bucket key
            short = self._groups.get(key[:length])
            if short is not None:
                found.append(short)
        return [g for g in found if key.startswith(g.prompt)]

    def _new_group(self, prompt: bytes) -> _Group:
        known = self._known.get(prompt)
        digest = hashlib.blake2b(prompt, digest_size=6).hexdigest()
        group = _Group(known.id if known else f"g{digest}", prompt, known)
        self._groups[prompt] = group
        if len(prompt) >= BUCKET_BYTES:
            self._buckets.setdefault(prompt[:BUCKET_BYTES], []).append(group)
        return group

    def _new_member(self, group: _Group, position: int | None = None) -> Placement:
        """A new member: the known member at `position` (a hinted one), else the first known one not placed yet
        (hinted members may have come first), else one past the known members."""
        member = len(group.members)
        if position is None and group.known is not None:
            position = next((i for i, ident in enumerate(group.known.members) if ident not in self._by_id), None)
        known = position is not None
        if known:
            assert group.known is not None and position is not None
            ident, index, member = group.known.members[position], group.known.indexes[position], position
        else:
            ident, index = f"{group.id}-{member}", self._next_index
            self._next_index += 1
        trajectory = _Trajectory(ident, group, index, member, known, [group.prompt], [b""], [0], group.prompt, None)
        group.members.append(trajectory)
        self._by_id[ident] = trajectory
        return self._placement(trajectory, b"", "new")

    def _retry(self, trajectory: _Trajectory) -> Placement:
        trajectory.attempts[-1] += 1
        trajectory.outcome = None
        return self._placement(trajectory, trajectory.appends[-1], "retry")

    def _next_turn(self, trajectory: _Trajectory, key: bytes) -> Placement:
        append = key[len(trajectory.context):]
        trajectory.inputs.append(key)
        trajectory.appends.append(append)
        trajectory.attempts.append(0)
        trajectory.outcome = None
        return self._placement(trajectory, append, "turn")

    @staticmethod
    def _placement(trajectory: _Trajectory, append: bytes, kind: str) -> Placement:
        return Placement(trajectory.id, trajectory.group.id, len(trajectory.inputs) - 1, trajectory.attempts[-1],
                         trajectory.index, trajectory.member, append, kind, trajectory.known)
