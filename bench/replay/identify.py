"""Which trajectory, turn and attempt a request is, from what real clients send.

Real rollout code sends no trajectory id: a request is recognised by its token prefix.
The prompt locates the group (a dictionary lookup on the tokens right after the prefix all
prompts share), the request length and one `memcmp` per member locate the turn. Members of
a GRPO group send identical turn-0 requests; those are told apart only by an explicit
`X-Bench-Trajectory` header or `rid`, else assigned to members in arrival order (first
unclaimed member, then a member whose last attempt failed). Everything after turn 0 carries
the member's own outputs and is identified exactly.

A request that is a recorded turn's input followed by the first k tokens of that turn's recorded output
resumes an aborted answer (a partial rollout, as SGLang clients resume one): it is that turn's next
attempt, `resume=k`, and its answer is the rest of the recorded output, not the whole of it again.
"""

from __future__ import annotations

import hashlib
import os
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass

from .store import INT32, Group, RecordedTrajectory, TraceStore

KEY_TOKENS = 32


@dataclass(slots=True, unsafe_hash=True)
class Identity:
    """What a request was taken to be; `drift` names how it departs from the recording.

    Made once per request: a slots class, not a frozen one (whose `__init__` sets every field through
    `object.__setattr__`, about four times the cost). Hashed by value (a dict key in `upstream`); never changed
    after it is made, though nothing enforces that any more.
    """

    trajectory: str | None
    group: str | None
    turn: int | None
    attempt: int
    drift: str | None = None  # None | "context" | "extra_turn" | "unknown_prompt"
    digest: str | None = None  # for unknown prompts: names the request in place of a trajectory id
    by_order: bool = False  # one of several members' identical requests, told apart only by arrival order
    resume: int = 0  # tokens of the turn's recorded output the request already carries (a resumed abort)

    @property
    def key(self) -> tuple[str | None, int | None]:
        return self.trajectory, self.turn


class PromptIndex:
    """Finds the groups whose prompt starts a request."""

    def __init__(self, groups: list[Group]) -> None:
        prompts = [g.prompt for g in groups]
        common = len(os.path.commonprefix(prompts)) // INT32 * INT32 if prompts else 0
        shortest = min((len(p) for p in prompts), default=0)
        self._start = common
        self._end = common + max(0, min(KEY_TOKENS * INT32, shortest - common))
        self._by_key: dict[bytes, list[Group]] = defaultdict(list)
        for group in groups:
            self._by_key[group.prompt[self._start : self._end]].append(group)

    def groups_for(self, packed: bytes) -> list[Group]:
        if len(packed) < self._end:
            candidates = [g for bucket in self._by_key.values() for g in bucket]
        else:
            candidates = self._by_key.get(packed[self._start : self._end], [])
        return [g for g in candidates if packed.startswith(g.prompt)]


class Identifier:
    """Stateful request identification: attempts and group-member claims live here."""

    def __init__(self, store: TraceStore) -> None:
        self._store = store
        self._index = PromptIndex(list(store.groups.values()))
        self._turn_by_len = {t.id: {turn.input_len: i for i, turn in enumerate(t.turns)} for t in store.trajectories}
        self._attempts: dict[tuple[str | None, int | None], int] = defaultdict(int)
        self._failed: set[tuple[str, int]] = set()
        self._unknown_attempts: dict[bytes, int] = defaultdict(int)
        # the trajectories the run dispatched (None: all): identical requests of a group are claimed among
        # these first, so a run of some members (a repro, `--n`) is served the answers of those members
        self.dispatched: frozenset[str] | None = None

    def identify(self, packed: bytes, hint: str | None = None) -> Identity:
        """Identify a request given its input ids packed as int32 bytes."""
        if hint is not None:
            trajectory = self._store.by_id.get(hint) or self._store.by_id.get(hint.split(":", 1)[0])
            if trajectory is not None:
                turn = self._exact_turn(trajectory, packed)
                if turn is not None:
                    return self._claim(trajectory, turn, None)
                return self._drifted(trajectory, packed)
        matches: list[tuple[RecordedTrajectory, int]] = []
        groups = self._index.groups_for(packed)
        for group in groups:
            for member in group.members:
                turn = self._exact_turn(member, packed)
                if turn is not None:
                    matches.append((member, turn))
        if len(matches) == 1:
            return self._claim(*matches[0], None)
        if matches:
            return self._claim_among(matches)
        if groups:
            return self._closest(groups, packed)
        digest = hashlib.blake2b(packed, digest_size=16).digest()
        self._unknown_attempts[digest] += 1
        return Identity(None, None, None, self._unknown_attempts[digest], "unknown_prompt", digest.hex())

    def record_outcome(self, identity: Identity, succeeded: bool) -> None:
        """Tell the identifier how an attempt ended, so a retry is matched to the failed member."""
        if identity.trajectory is None or identity.turn is None:
            return
        key = (identity.trajectory, identity.turn)
        if succeeded:
            self._failed.discard(key)
        else:
            self._failed.add(key)

    def _exact_turn(self, trajectory: RecordedTrajectory, packed: bytes) -> int | None:
        turn = self._turn_by_len[trajectory.id].get(len(packed) // INT32)
        if turn is not None and trajectory.request_matches(turn, packed):
            return turn
        return None

    def _claim(self, trajectory: RecordedTrajectory, turn: int, drift: str | None, by_order: bool = False,
               resume: int = 0) -> Identity:
        key = (trajectory.id, turn)
        attempt = self._attempts[key] = self._attempts[key] + 1
        # positional (digest None): keyword arguments cost more to match, once per request
        return Identity(trajectory.id, trajectory.group_id, turn, attempt, drift, None, by_order, resume)

    def _claim_among(self, matches: list[tuple[RecordedTrajectory, int]], resume: int = 0) -> Identity:
        """Identical requests from several members: first unclaimed, then a failed one, then the least tried.
        With `resume` (the request resumes an aborted answer its members share the start of), the ids shared."""
        matches.sort(key=lambda m: (m[0].index, m[1]))
        if self.dispatched is not None:
            matches = [m for m in matches if m[0].id in self.dispatched] or matches
        by_order = len(matches) > 1

        def claim(member: RecordedTrajectory, turn: int) -> Identity:
            done = resume - member.turns[turn].input_len if resume else 0
            return self._claim(member, turn, None, by_order=by_order, resume=done)

        if not resume:  # a resumed answer is never a member's first request for its turn
            for member, turn in matches:
                if self._attempts[(member.id, turn)] == 0:
                    return claim(member, turn)
        for member, turn in matches:
            if (member.id, turn) in self._failed:  # an aborted answer counts as failed
                return claim(member, turn)
        member, turn = min(matches, key=lambda m: (self._attempts[(m[0].id, m[1])] == 0 if resume else False,
                                                   self._attempts[(m[0].id, m[1])], m[0].index))
        return claim(member, turn)

    def _closest(self, groups: list[Group], packed: bytes) -> Identity:
        members = [m for g in groups for m in g.members]
        shared = {m.id: self._shared(m, packed) for m in members}
        most = max(shared.values())
        tied = [m for m in members if shared[m.id] == most]
        if len(tied) > 1:  # members whose answers start alike: a resumed start is one of theirs, told by order
            resumed = [(m, turn) for m in tied for turn in [self._resumed_turn(m, packed, most)] if turn is not None]
            if resumed:
                return self._claim_among(resumed, resume=most)
        best = min(tied, key=lambda m: m.index)
        return self._drifted(best, packed)

    def _resumed_turn(self, trajectory: RecordedTrajectory, packed: bytes, shared: int) -> int | None:
        """The turn whose answer `packed` resumes, if it resumes one of `trajectory`'s."""
        turn = bisect_right([t.input_len + len(t.output_ids) for t in trajectory.turns], shared)
        return turn if self._resumed(trajectory, turn, packed, shared) else None

    def _drifted(self, trajectory: RecordedTrajectory, packed: bytes) -> Identity:
        """The client's context left the recording, or resumes a turn's answer: pick the turn it has reached."""
        shared = self._shared(trajectory, packed)
        ends = [t.input_len + len(t.output_ids) for t in trajectory.turns]
        turn = bisect_right(ends, shared)
        resume = self._resumed(trajectory, turn, packed, shared)
        if resume:
            return self._claim(trajectory, turn, None, resume=resume)
        drift = "extra_turn" if turn >= len(trajectory.turns) else "context"
        return self._claim(trajectory, turn, drift)

    @staticmethod
    def _resumed(trajectory: RecordedTrajectory, turn: int, packed: bytes, shared: int) -> int:
        """k when the request is turn `turn`'s recorded input plus the first k (0 < k < all) of its output."""
        if turn >= len(trajectory.turns) or shared * INT32 != len(packed):
            return 0
        recorded = trajectory.turns[turn]
        resume = shared - recorded.input_len
        if not 0 < resume < len(recorded.output_ids):
            return 0
        sequence = trajectory.sequences[recorded.sequence]
        return resume if sequence.startswith(packed) else 0

    @staticmethod
    def _shared(trajectory: RecordedTrajectory, packed: bytes) -> int:
        """Tokens the request shares with the trajectory's recorded sequence."""
        best = 0
        for sequence in trajectory.sequences:
            best = max(best, len(os.path.commonprefix([sequence, packed])) // INT32)
        return best
