"""What the server served, token by token: the ground truth the `provenance` invariant reads.

Every identified request gets an entry when it is identified and its tokens when it is played.
Token ids and logprobs live in two flat arrays (int32, float64) shared by all requests, so a
long run keeps a few bytes per served token and one small object per request, never a Python
list per row.

Each entry also names the request it continued (`parent`): the latest earlier request of the same
trajectory whose whole context (prompt and served output) starts this request's prompt, which is
how a multi-turn loop or a partial-rollout continuation grows its context. When no earlier context
is a prefix (a chat template re-rendered the history, or the client's context drifted from what it
was served), the latest earlier request with a shorter prompt is taken instead (`link = "earlier"`):
the loop's previous step. Following parents from a trajectory's last request gives the tokens its
final attempt was served, turn by turn.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from dataclasses import dataclass
from pathlib import Path

from .atomic_write import atomic_path
from .request_log import RequestRecord
from .spill import evictable, over_window

ROOT, PREFIX, EARLIER = "root", "prefix", "earlier"
_INT32 = 4


def context_hash(data: "bytes | memoryview" = b"") -> "hashlib._Hash":
    """The hash that names a context (prompt + served output, packed int32) for `_parent_of`'s prefix matches. Every
    identified request hashes its whole prompt (1,640 tokens on average in agentic-500) once or twice: SHA-256 runs
    on the CPU's SHA extensions where it has them, three times blake2b's speed here, and is as collision-free."""
    return hashlib.sha256(data)


def _digest(data: "bytes | memoryview") -> bytes:
    return hashlib.sha256(data).digest()


def token_digest(ids: "array[int] | list[int]") -> str:
    """A short, stable name for a token sequence (the `served_digest` column)."""
    packed = ids.tobytes() if isinstance(ids, array) else array("i", ids).tobytes()
    return hashlib.blake2b(packed, digest_size=8).hexdigest()


@dataclass(slots=True)
class ServedEntry:
    """One identified request: where its served tokens sit in the arrays and what it continued."""

    index: int  # position among the entries (arrival order)
    record: RequestRecord
    prompt_len: int
    parent: int | None = None  # the entry whose context this request's prompt extends
    root: int = 0  # the first entry of its chain (itself when it continues nothing)
    link: str = ROOT
    offset: int = 0  # into the token arrays, once played
    count: int = 0  # tokens served (0: refused, queued abort, never played)
    logprobs_shown: bool = False  # whether the answer carried logprobs at all
    played: bool = False  # its tokens are final (a request still in flight, or refused, may not be continued)
    context_digest: bytes = b""  # of prompt + served output, packed int32
    prompt_hash: "hashlib._Hash | None" = None  # the prompt's digest so far, until `finish` adds the output
    family: str | None = None  # its chain starts at a request told apart only by arrival order: that one's group

    @property
    def trajectory(self) -> str | None:
        return self.record.trajectory

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.count


class EvictedEntry(LookupError):
    """The tokens asked for were served to a request that a bounded store (`ServedTokens.retain`) has let go."""


class ServedTokens:
    """Append-only store of served tokens, per identified request.

    Unbounded unless told (`retain`): a run's invariants read every entry. A long-lived server keeps the latest
    `window` entries: older ones (played, or two windows old) are let go with their tokens, in arrival order. What
    that changes is documented (README, Limits): a request continuing one let go is logged as continuing nothing
    (`continues` empty); asking for a let-go entry's tokens raises `EvictedEntry`; `evicted` counts them."""

    def __init__(self) -> None:
        self.entries: list[ServedEntry] = []  # in memory: entries `_base` onwards
        self._base = 0  # index of entries[0]
        self._id_base = 0  # position of ids[0] among every token ever served (entry offsets count from the first)
        self.window: int | None = None
        self.evicted = 0
        self._ids = array("i")
        self._logprobs = array("d")  # NaN where the answer showed no usable logprob
        # answers served whole, in the order they finished, not yet copied into the arrays: the fast path serves one
        # saved answer many times, and copying each into ever-growing arrays cost a fresh page about every request
        self._pending: list[tuple["array[int]", "array[float]"]] = []  # (ids, logprobs): the answer's own arrays
        self._pending_tokens = 0
        self._by_trajectory: dict[str, list[int]] = {}
        # per trajectory, its entries by prompt length: only a shorter prompt can be continued (`_shorter`), and
        # the retries of one turn (a benchmark repeats a turn thousands of times) are then never walked again
        self._by_prompt_len: dict[str, dict[int, list[int]]] = {}
        self._by_record: dict[int, int] = {}  # id(record) -> entry index
        # entry index -> (ids, logprobs) of its answer's logprob entries, where they disagreed with its token ids
        self.entry_streams: dict[int, tuple[list[int], list[float]]] = {}
        # per group: the entries whose chain starts at a request told apart from its siblings' only by arrival
        # order, so which member's attempt it was is a guess (`Identity.by_order`)
        self._by_family: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return self._base + len(self.entries)

    @property
    def ids(self) -> "array[int]":
        """Every kept served token id (int32), in the order the answers finished (entry offsets index it)."""
        if self._pending:
            self._flush()
        return self._ids

    @property
    def logprobs(self) -> "array[float]":
        """The logprob each kept token was shown with (float64, NaN where none), aligned with `ids`."""
        if self._pending:
            self._flush()
        return self._logprobs

    def _flush(self) -> None:
        """Copy the pending answers into the arrays, in order: their entries' offsets were given as if already there."""
        pending, self._pending, self._pending_tokens = self._pending, [], 0
        ids, logprobs = self._ids, self._logprobs
        for answer_ids, answer_logprobs in pending:
            ids.extend(answer_ids)
            logprobs.extend(answer_logprobs)

    def retain(self, window: int) -> None:
        """Keep about the latest `window` entries (and their tokens) in memory; older ones are let go."""
        if window < 1:
            raise ValueError(f"the served-token window must be at least 1, got {window}")
        self.window = window

    def _at(self, index: int) -> ServedEntry | None:
        """Entry `index`, or None once let go."""
        at = index - self._base
        return self.entries[at] if at >= 0 else None

    def _evict(self) -> None:
        """Let go the oldest entries past the window: those whose request is over (`_over`); one still in flight stops
        the chunk unless half a window more came since (`spill.evictable`). Their index rows go too, and the tokens
        no entry kept still points into."""
        assert self.window is not None
        count = evictable(self.entries, self.window, _over)
        if count == 0:
            return
        for entry in self.entries[:count]:
            trajectory = entry.record.trajectory
            if trajectory is not None:
                _drop_first(self._by_trajectory, trajectory, entry.index)
                by_length = self._by_prompt_len.get(trajectory)
                if by_length is not None:
                    _drop_first(by_length, entry.prompt_len, entry.index)
                    if not by_length:
                        del self._by_prompt_len[trajectory]
            if entry.family is not None:
                _drop_first(self._by_family, entry.family, entry.index)
            self._by_record.pop(id(entry.record), None)
            self.entry_streams.pop(entry.index, None)
        del self.entries[:count]
        self._base += count
        self.evicted += count
        cut = min((e.offset for e in self.entries if e.played and e.count), default=self._id_base + len(self.ids))
        if cut > self._id_base:  # answers are stored as they finish, not as they arrive: cut below the oldest kept
            del self.ids[: cut - self._id_base]
            del self.logprobs[: cut - self._id_base]
            self._id_base = cut

    def begin(self, record: RequestRecord, prompt: bytes, prompt_digest: bytes | None = None) -> ServedEntry:
        """Register an identified request (prompt as packed int32) and find the request it continues;
        `prompt_digest`: the prompt's digest, when known (its answer then knows the whole context's: `PackedAnswer`)."""
        entries = self.entries
        index = self._base + len(entries)  # `len(self)`, without the method call (once per request)
        size = len(prompt) // _INT32
        # positional (parent None, root itself, link ROOT, nothing played yet): keywords cost more to match
        if prompt_digest is None:
            hashed = context_hash(prompt)  # kept: `finish` adds the output, not the prompt again
            entry = ServedEntry(index, record, size, None, index, ROOT, 0, 0, False, False, hashed.digest(), hashed)
        else:
            entry = ServedEntry(index, record, size, None, index, ROOT, 0, 0, False, False, prompt_digest)
        trajectory = record.trajectory
        if trajectory is not None:
            # `get` before making an empty list or dict: a benchmark repeats a trajectory's turn thousands of times
            siblings = self._by_trajectory.get(trajectory)
            if siblings is None:
                siblings = self._by_trajectory[trajectory] = []
            by_length = self._by_prompt_len.get(trajectory)
            if by_length is None:
                by_length = self._by_prompt_len[trajectory] = {}
            # only a shorter prompt can be continued: none when the trajectory has sent this length only (a turn's
            # retries), else `_shorter` finds them
            shorter = self._shorter(by_length, size) if by_length and not (
                len(by_length) == 1 and size in by_length) else None
            if shorter:  # else it continues nothing (a trajectory's first turn, and every retry of it)
                entry.parent, entry.link = self._parent_of(shorter, prompt)
                if entry.parent is not None:
                    parent = self._at(entry.parent)
                    assert parent is not None  # found among the kept entries
                    entry.root, entry.family = parent.root, parent.family
            siblings.append(index)
            same = by_length.get(size)
            if same is None:
                by_length[size] = [index]
            else:
                same.append(index)
        if entry.parent is None and record.by_order and record.group is not None:
            entry.family = record.group
        entries.append(entry)
        if entry.family is not None:
            self._by_family.setdefault(entry.family, []).append(index)
        self._by_record[id(record)] = index
        record.served_tokens = 0
        if self.window is not None and over_window(len(entries), self.window):
            self._evict()
        return entry

    def finish(self, record: RequestRecord, prompt: list[int], ids: list[int], logprobs: list[float | None] | None,
               weight_version: str | None,
               entries: tuple[list[int], list[float | None]] | None = None) -> None:
        """The tokens a played request served (a prefix when it was aborted), with the logprobs its answer showed;
        `entries`: the ids and logprobs of its logprob entries, when a fault made them disagree with its ids."""
        self.finish_packed(record, prompt, PackedAnswer.of(ids, logprobs), weight_version, entries)

    def finish_packed(self, record: RequestRecord, prompt: list[int], answer: "PackedAnswer",
                      weight_version: str | None,
                      entries: tuple[list[int], list[float | None]] | None = None) -> None:
        """`finish`, with the served tokens already converted (the server's fast path serves one answer many times)."""
        index = self._by_record.get(id(record))
        if index is None:
            return  # not identified through `begin` (a bench-internal request)
        entry = self.entries[index - self._base]
        count = len(answer.ids)
        entry.offset, entry.count, entry.played = self._id_base + len(self._ids) + self._pending_tokens, count, True
        self._pending.append((answer.ids, answer.logprobs))  # copied into the arrays when they are read (`_flush`)
        self._pending_tokens += count
        entry.logprobs_shown = answer.shown
        if entry.prompt_hash is not None and len(prompt) == entry.prompt_len:
            entry.prompt_hash.update(answer.packed)  # the same digest as of prompt + output, without the prompt again
            entry.context_digest, entry.prompt_hash = entry.prompt_hash.digest(), None
        elif answer.context is not None and len(prompt) == entry.prompt_len:
            entry.context_digest = answer.context  # the answer to this very prompt, digested once
        else:
            hashed = context_hash(array("i", prompt).tobytes())
            hashed.update(answer.packed)
            entry.context_digest = hashed.digest()
        if entries is not None:  # rare (a fault): kept beside the arrays, not in them
            self.entry_streams[index] = (list(entries[0]), [_as_float(v) for v in entries[1]])
        record.served_tokens, record.served_digest = len(answer.ids), answer.digest
        record.weight_version = weight_version
        record.logprobs_served = entry.logprobs_shown
        parent = None if entry.parent is None else self._at(entry.parent)
        if parent is not None:
            record.continues = parent.record.seq

    def _kept_offset(self, entry: ServedEntry) -> int:
        if entry.index < self._base:
            raise EvictedEntry(f"the tokens served to request seq {entry.record.seq} were let go: the server keeps "
                               f"the latest {self.window} requests' tokens ({self.evicted} let go so far)")
        return entry.offset - self._id_base

    def tokens(self, entry: ServedEntry) -> "array[int]":
        offset = self._kept_offset(entry)
        return self.ids[offset: offset + entry.count]

    def logprobs_of(self, entry: ServedEntry) -> "array[float]":
        offset = self._kept_offset(entry)
        return self.logprobs[offset: offset + entry.count]

    def of_trajectory(self, trajectory: str) -> list[ServedEntry]:
        """Its requests in arrival order (the kept ones)."""
        return [self.entries[i - self._base] for i in self._by_trajectory.get(trajectory, [])]

    def of_family(self, group: str) -> list[ServedEntry]:
        """The group's entries whose chain starts at an identical request claimed by arrival order."""
        return [self.entries[i - self._base] for i in self._by_family.get(group, [])]

    def entry_of(self, record: RequestRecord) -> ServedEntry | None:
        index = self._by_record.get(id(record))
        return None if index is None else self.entries[index - self._base]

    def chain(self, last: ServedEntry) -> list[ServedEntry]:
        """The requests `last` continued, first to last: one attempt's path through the turns (from the oldest kept)."""
        path = [last]
        while path[-1].parent is not None:
            parent = self._at(path[-1].parent)  # type: ignore[arg-type]
            if parent is None:
                break
            path.append(parent)
        return path[::-1]

    def nbytes(self) -> int:
        """The served data itself: token ids and logprobs."""
        return self.ids.itemsize * len(self.ids) + self.logprobs.itemsize * len(self.logprobs)

    def write(self, path: str | Path) -> Path:
        """The arrays as one NumPy `.npz`: `seq`, `offset`, `count` per request, `ids` and `logprobs` per token."""
        import numpy as np

        path = Path(path)
        seq = np.array([e.record.seq for e in self.entries], dtype=np.int64)
        offsets = np.array([e.offset - self._id_base for e in self.entries], dtype=np.int64)
        counts = np.array([e.count for e in self.entries], dtype=np.int64)
        with atomic_path(path) as temporary, temporary.open("wb") as handle:
            np.savez_compressed(handle, seq=seq, offset=offsets, count=counts,
                                ids=np.frombuffer(self.ids, dtype=np.int32) if self.ids else np.zeros(0, np.int32),
                                logprobs=np.frombuffer(self.logprobs, dtype=np.float64) if self.logprobs
                                else np.zeros(0, np.float64))
        return path

    @staticmethod
    def _shorter(by_length: dict[int, list[int]], size: int) -> list[int]:
        """A trajectory's entries whose prompt is shorter than `size` tokens, in arrival order: the only ones
        `_parent_of` can pick (a context continued is the prompt plus served tokens, so its prompt is shorter)."""
        if len(by_length) == 1 and size in by_length:  # the retries of one turn only (a frame-free check)
            return []
        shorter = [index for length, indices in by_length.items() if length < size for index in indices]
        shorter.sort()
        return shorter

    def _parent_of(self, siblings: list[int], prompt: bytes) -> tuple[int | None, str]:
        """The latest earlier played request whose whole context starts `prompt` (`siblings`: the trajectory's
        earlier entries whose prompt is shorter, in arrival order).

        A context as long as the prompt continues it only if it served tokens (a partial rollout resumed after an
        abort); one that served none is an earlier attempt at the same turn and is passed over."""
        size = len(prompt) // _INT32
        entries, base = self.entries, self._base
        candidates = [i for i in reversed(siblings) if self._continuable(entries[i - base], size)]
        shorter = [i for i in siblings if entries[i - base].played and entries[i - base].prompt_len < size]
        latest = shorter[-1] if shorter else None  # the loop's previous step, when it is one
        hashed: dict[int, bytes] = {}
        for i in candidates:
            entry = entries[i - base]
            length = entry.context_len
            if length not in hashed:
                hashed[length] = _digest(memoryview(prompt)[: length * _INT32])  # no copy of the prefix
            if hashed[length] == entry.context_digest:
                if latest is not None and latest > i and i in self._ancestors(latest):
                    return latest, EARLIER  # the client went on from a later step whose output it altered
                return i, PREFIX
        if latest is not None:  # the context was re-rendered or drifted: go on from the latest shorter prompt
            return latest, EARLIER
        return None, ROOT

    def _ancestors(self, index: int) -> set[int]:
        found: set[int] = set()
        entry = self._at(index)
        while entry is not None and entry.parent is not None:
            found.add(entry.parent)
            entry = self._at(entry.parent)
        return found


    @staticmethod
    def _continuable(entry: ServedEntry, size: int) -> bool:
        return entry.played and (entry.context_len < size or entry.context_len == size and entry.count > 0)


def _over(entry: ServedEntry) -> bool:
    """Its request is over: played, or answered without being played (a refusal, an injected error)."""
    return entry.played or entry.record.latency_s is not None


def _drop_first(index: dict, key: object, value: int) -> None:
    """Remove `value` from the list `index[key]` (its first, as entries go oldest first); drop an emptied key."""
    values = index.get(key)
    if values is None:
        return
    if values and values[0] == value:
        del values[0]
    elif value in values:
        values.remove(value)
    if not values:
        del index[key]


_NUMBERS = frozenset({float, int})


@dataclass(frozen=True, slots=True)
class PackedAnswer:
    """The tokens one answer served, as the store keeps them: ids (int32), the logprobs the answer showed (float64,
    NaN where it showed none), the packed ids and their digest."""

    ids: "array[int]"
    logprobs: "array[float]"
    shown: bool  # the answer carried logprobs at all
    packed: bytes
    digest: str  # `token_digest(ids)`
    context: bytes | None = None  # the context digest of prompt + these tokens, for the one prompt it answers

    @classmethod
    def of(cls, ids: list[int], logprobs: list[float | None] | None, prompt: "bytes | hashlib._Hash | None" = None
           ) -> "PackedAnswer":
        """`prompt` (packed int32, or its `context_hash` so far): the one prompt this answer is served to, whose
        context digest it then holds."""
        packed_ids = array("i", ids)
        shown = logprobs or []
        head = shown if len(shown) == len(ids) else shown[: len(ids)]
        if len(head) == len(ids) and set(map(type, head)) <= _NUMBERS:  # the usual answer: converted in C
            values = array("d", head)
        else:  # None (no usable logprob) or too few shown: NaN there
            values = array("d", (_as_float(shown[i]) if i < len(shown) else math.nan for i in range(len(ids))))
        raw = packed_ids.tobytes()
        context = None
        if prompt is not None:
            hashed = context_hash(prompt) if isinstance(prompt, bytes) else prompt.copy()
            hashed.update(raw)
            context = hashed.digest()
        return cls(packed_ids, values, logprobs is not None, raw, hashlib.blake2b(raw, digest_size=8).hexdigest(),
                   context)


def _as_float(value: float | None) -> float:
    return math.nan if value is None else float(value)
