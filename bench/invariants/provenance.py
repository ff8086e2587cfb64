"""Provenance: every token a sample trains on is a token the server served to it, in order, from its final attempt.

Reads only the sample records and what the server served (`bench.records.served_tokens`). For each
sample the tokens under loss mask 1 must be, in order, the turns served along its trajectory's final
attempt (the chain of requests its last request continued), each turn whole; a truncated sample may
stop early within its last trained turn. A turn may be left out of training: before the first trained
turn it may sit in the prompt, after it it must be in the response whole under loss mask 0 (kept, not
lost). Loss-mask-0 tokens are never compared: they are never claimed as model tokens. Each logprob
must equal the one the answer showed, within `LOGPROB_TOLERANCE` (clients keep logprobs as float32);
a number where the answer showed none (omitted, null, NaN; vLLM writes none as -9999.0 on its chat
and token routes, and that value is what was shown) is invented, none where it showed one is missing.

Where identical group requests were told apart by arrival order only, the end of any path they started
may be the sample's final attempt (each matched once). Where a fault made an answer's logprob entries
disagree with its ids, the entries' reading counts as served too (slime reads tokens from them).
A target whose framework re-tokenises the text it was served declares `tokens_source = "retokenized"`:
its samples are compared as text, and logprobs are not compared (positions do not line up).
Every sample gets an `Assessment` that names the check made, or why none could be made.
On a mismatch the sample's model tokens are decomposed into the served runs they came from
(this attempt, an earlier attempt, another trajectory, never served) for the evidence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from bench.records.sample import RETOKENIZED, SampleRecord
from bench.records.served_tokens import ServedEntry, ServedTokens

from .base import RunView, Violation, preceding
from .token_arrays import Trained, trained

NAME = "provenance"
NO_LOGPROB_SENTINEL = -9999.0  # what vLLM's chat and token routes write for a logprob they have none of
ABS_TOL, REL_TOL = 1e-4, 1e-6  # |got - served| <= ABS_TOL + REL_TOL * |served|: float32 keeps ~7 digits
LOGPROB_TOLERANCE = f"|got - served| <= {ABS_TOL:g} + {REL_TOL:g} * |served|"
_MIN_RUN = 3  # a run of tokens claimed from a request the sample did not continue must be at least this long

# assessment verdicts
MATCH, MISMATCH, NOT_CHECKED = "match", "mismatch", "not checked"
# checks
TOKENS_AND_LOGPROBS, TOKENS_ONLY, TEXT, NONE = "tokens+logprobs", "tokens", "text", "none"


@dataclass(frozen=True)
class Assessment:
    """What provenance could say about one sample."""

    trajectory: str
    verdict: str  # match | mismatch | not checked
    check: str  # tokens+logprobs | tokens | text | none
    note: str = ""  # why not checked, or what was not compared
    violation: Violation | None = None

    @property
    def label(self) -> str:
        """One word-ish value for the `provenance` column of the trajectories table."""
        if self.verdict == NOT_CHECKED:
            return f"not checked: {self.note}"
        return f"{self.verdict} ({self.check})"


@dataclass(frozen=True)
class Segment:
    """A run of a sample's model tokens and where it came from (`entry` None: never served)."""

    start: int  # in the sample's model tokens
    length: int
    entry: ServedEntry | None = None
    offset: int = 0  # in the entry's served tokens
    in_final: bool = False

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": self.length, "at": self.start}
        if self.entry is None:
            return out | {"served": False}
        return out | _where(self.entry) | {"from": self.offset, "final_attempt": self.in_final}


def check(view: RunView) -> list[Violation]:
    return [a.violation for a in assess(view).values() if a.violation is not None]


def assess(view: RunView) -> dict[str, Assessment]:
    """One assessment per sample record (worked out once per view: the check and the report both read it)."""
    if NAME not in view.memo:
        view.memo[NAME] = _assess_all(view)
    return view.memo[NAME]  # type: ignore[no-any-return]


def _assess_all(view: RunView) -> dict[str, Assessment]:
    served = view.served
    if served is None:
        return {r.trajectory: Assessment(r.trajectory, NOT_CHECKED, NONE, "the run kept no served tokens")
                for r in view.records}
    unidentified = any(r.drift == "unknown_prompt" for r in view.requests)
    used: set[int] = set()  # answers of a group's identical requests already matched to one of its samples
    flat = _Flat(served)
    return {r.trajectory: _assess(view, served, r, unidentified, used, flat) for r in view.records}


class _Flat:
    """Copies of the served arrays as NumPy arrays, made once per assessment (copies, not views: a view would pin
    the store's arrays, which a late answer may still extend), so a sample's served tokens are slices, not loops."""

    def __init__(self, served: ServedTokens) -> None:
        self.ids = np.array(served.ids, dtype=np.int32)
        self.logprobs = np.array(served.logprobs, dtype=np.float64)
        self._served = served

    def along(self, chain: list[ServedEntry], from_entries: bool
              ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
        """`_expected` without a Python step per token: the chain's served ids and logprobs, and one span per
        answer that served tokens, (chain index, start in the ids, tokens)."""
        ids: list[np.ndarray] = []
        logprobs: list[np.ndarray] = []
        spans: list[tuple[int, int, int]] = []
        at = 0
        for index, entry in enumerate(chain):
            stream = self._served.entry_streams.get(entry.index) if from_entries else None
            if stream is not None:
                tokens, values = np.array(stream[0], dtype=np.int64), np.array(stream[1], dtype=np.float64)
            else:
                tokens = self.ids[entry.offset: entry.offset + entry.count]
                values = self.logprobs[entry.offset: entry.offset + entry.count]
            if len(tokens):
                ids.append(tokens)
                logprobs.append(values)
                spans.append((index, at, len(tokens)))
                at += len(tokens)
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.float64), spans
        return np.concatenate(ids), np.concatenate(logprobs), spans


def _assess(view: RunView, served: ServedTokens, record: SampleRecord, unidentified: bool,
            used: set[int], flat: _Flat) -> Assessment:
    trajectory = record.trajectory
    if record.outcome not in ("completed", "truncated", "aborted"):
        return Assessment(trajectory, NOT_CHECKED, NONE, f"not a training sample ({record.outcome})")
    if len(record.loss_mask) != len(record.response_ids):
        return Assessment(trajectory, NOT_CHECKED, NONE,
                          "loss mask and response ids differ in length (token_alignment reports it)")
    tokens = trained(view.memo, record)
    if not len(tokens.positions):
        return Assessment(trajectory, NOT_CHECKED, NONE, "no token under loss mask 1: nothing is trained on")
    final = _final_request(served, record)
    if final is None and unidentified:
        return Assessment(trajectory, NOT_CHECKED, NONE, "none of its requests was identified (unknown prompts)")
    chain = served.chain(final) if final is not None else []
    if view.tokens_source == RETOKENIZED:
        return _assess_text(view, served, record, tokens.positions.tolist(), chain)
    return _assess_tokens(view, served, record, tokens, chain, _alternatives(served, record, final), used, flat)


def _final_request(served: ServedTokens, record: SampleRecord) -> ServedEntry | None:
    """The trajectory's last request; among those the record names, when it names its final attempt's."""
    entries = served.of_trajectory(record.trajectory)
    if record.request_ids:
        named = set(record.request_ids)
        entries = [e for e in entries if e.record.rid in named] or entries
    return entries[-1] if entries else None


def _alternatives(served: ServedTokens, record: SampleRecord, final: ServedEntry | None) -> list[ServedEntry]:
    """Where the sample's final attempt may end when the bench cannot know which member's it was: identical
    requests of a group told apart only by arrival order make the end of any path they started a candidate
    (an answer no later request continued; latest first)."""
    if record.request_ids or (final is not None and served.entries[final.root].record.by_order is False):
        return []
    family = served.of_family(record.group)
    continued = {e.parent for e in family}
    return sorted((e for e in family if e.index not in continued), key=lambda e: e.index, reverse=True)


def _expected(served: ServedTokens, chain: list[ServedEntry], from_entries: bool = False
              ) -> tuple[list[int], list[float], list[tuple[int, int]]]:
    """The final attempt's served tokens, their logprobs, and (chain index, offset) per token. `from_entries`: as
    the answers' logprob entries showed them where a fault made those disagree with the token ids."""
    ids: list[int] = []
    logprobs: list[float] = []
    origin: list[tuple[int, int]] = []
    for index, entry in enumerate(chain):
        stream = served.entry_streams.get(entry.index) if from_entries else None
        tokens, values = stream if stream is not None else (served.tokens(entry), served.logprobs_of(entry))
        ids += tokens
        logprobs += values
        origin += [(index, offset) for offset in range(len(tokens))]
    return ids, logprobs, origin


def _readings(served: ServedTokens, chain: list[ServedEntry]) -> list[bool]:
    """How the chain's answers may be read: by their token ids, and by their logprob entries too when a fault
    made the two disagree in one of them (a client reading tokens from the entries holds those)."""
    return [False, True] if any(e.index in served.entry_streams for e in chain) else [False]


def _assess_tokens(view: RunView, served: ServedTokens, record: SampleRecord, tokens: Trained,
                   chain: list[ServedEntry], alternatives: list[ServedEntry], used: set[int], flat: _Flat) -> Assessment:
    """Against the final attempt; when that is a guess, against the first unused candidate that matches."""
    trajectory = record.trajectory
    positions = tokens.positions.tolist()
    got_array = tokens.ids
    got = got_array.tolist() if got_array is not None else [record.response_ids[i] for i in positions]
    token_match: tuple[list[ServedEntry], np.ndarray, list[tuple[int, int]],
                       tuple[int, str, float | None]] | None = None
    chains = [chain] if not alternatives else [served.chain(e) for e in alternatives if e.index not in used]
    for candidate, from_entries in ((c, reading) for c in chains for reading in _readings(served, c)):
        ids, logprobs, spans = flat.along(candidate, from_entries)
        if got_array is not None and np.array_equal(got_array, ids):
            chosen: dict[int, int] | None = {index: length for index, _, length in spans}  # every turn, whole
        else:
            expected = ids.tolist()
            chosen = _trained_turns(record, got, expected, [(index, expected[start: start + length])
                                                             for index, start, length in spans])
        if chosen is None:
            continue
        taken = [(index, start, chosen.get(index, 0)) for index, start, _ in spans]
        expected_lp = np.concatenate([logprobs[start: start + count] for _, start, count in taken]) if taken \
            else np.zeros(0, np.float64)
        problem = None if record.logprobs is None else _first_logprob_problem(record, tokens, expected_lp)
        if problem is None:
            if alternatives:
                used.add(candidate[-1].index)
            check, notes = (TOKENS_ONLY, ["the sample carries no logprobs"]) if record.logprobs is None else \
                (TOKENS_AND_LOGPROBS, [])
            untrained = sum(1 for index, entry in enumerate(candidate) if entry.count and index not in chosen)
            if untrained:
                notes.append(f"{untrained} served turn(s) not trained on (in the prompt, or whole under loss mask 0)")
            if from_entries:
                notes.append("as its answers' logprob entries showed them (a fault made them disagree with the "
                             "token ids)")
            return Assessment(trajectory, MATCH, check, "; ".join(notes))
        if token_match is None:
            origin = [(index, offset) for index, _, count in taken for offset in range(count)]
            token_match = (candidate, expected_lp, origin, problem)
    if token_match is not None:
        candidate, expected_lp, origin, (k, kind, have) = token_match
        entry, offset = candidate[origin[k][0]], origin[k][1]
        return Assessment(trajectory, MISMATCH, TOKENS_AND_LOGPROBS, violation=_logprob_violation(
            view, record, kind, k, positions[k], have, float(expected_lp[k]), entry, offset))
    expected, _, origin = _expected(served, chain)
    return Assessment(trajectory, MISMATCH, TOKENS_ONLY, violation=_token_violation(
        view, served, record, positions, got, expected, origin, chain, alternatives))


def _first_logprob_problem(record: SampleRecord, tokens: Trained, served: np.ndarray
                           ) -> tuple[int, str, float | None] | None:
    """The first model token whose logprob is not the one served: (its index, the problem, the logprob it
    carries). Located over arrays, then judged by `_logprob_problem` itself; a sample whose logprobs are not
    all plain numbers is judged token by token."""
    assert record.logprobs is not None
    have = tokens.logprobs
    if have is None:
        return _first_logprob_problem_slowly(record, tokens.positions.tolist(), served.tolist())
    with np.errstate(invalid="ignore"):
        shown, number = np.isnan(served), ~np.isnan(have)
        problems = (shown & number & (have != NO_LOGPROB_SENTINEL)) | (~shown & ~number) | \
            (~shown & number & ~(np.abs(have - served) <= ABS_TOL + REL_TOL * np.abs(served)))
    for k in np.flatnonzero(problems).tolist():  # the first, unless the scalar rule disagrees (it never should)
        i = int(tokens.positions[k])
        found = record.logprobs[i] if i < len(record.logprobs) else None
        problem = _logprob_problem(found, float(served[k]))
        if problem is not None:
            return k, problem, found
    return None


def _first_logprob_problem_slowly(record: SampleRecord, positions: list[int], served: list[float]
                                  ) -> tuple[int, str, float | None] | None:
    assert record.logprobs is not None
    for k, i in enumerate(positions):
        have = record.logprobs[i] if i < len(record.logprobs) else None
        problem = _logprob_problem(have, served[k])
        if problem is not None:
            return k, problem, have
    return None


def _trained_turns(record: SampleRecord, got: list[int], expected: list[int], spans: list[tuple[int, list[int]]]
                   ) -> dict[int, int] | None:
    """Which served turns the model tokens are, as {chain index: tokens trained}, or None when they are not.

    The model tokens must be whole turns of the final attempt, in order (a truncated sample's last one may stop
    early). A turn may be left out of training: before the first trained one it may sit in the prompt; after
    it, it must be in the response whole under loss mask 0 (masked, not lost). Every turn, when that fits.
    `spans`: (chain index, its served tokens) per answer that served any, in chain order; `expected` is them
    joined."""
    if got == expected:
        return {index: len(tokens) for index, tokens in spans}
    truncated = record.outcome == "truncated"
    masked = [_masked_whole(record, tokens) for _, tokens in spans]

    @lru_cache(maxsize=None)
    def reach(j: int, at: int) -> tuple[tuple[int, int], ...] | None:
        """A way to make got[at:] from spans[j:] (at > 0: training has started): ((span, tokens taken), ...)."""
        if at == len(got):
            return () if all(masked[j:]) else None
        if j == len(spans):
            return None
        tokens = spans[j][1]
        if got[at: at + len(tokens)] == tokens:
            rest = reach(j + 1, at + len(tokens))
            if rest is not None:
                return ((j, len(tokens)),) + rest
        left = len(got) - at
        if truncated and left < len(tokens) and tokens[:left] == got[at:] and all(masked[j + 1:]):
            return ((j, left),)
        return reach(j + 1, at) if at == 0 or masked[j] else None

    path = reach(0, 0)
    reach.cache_clear()
    return None if path is None else {spans[j][0]: count for j, count in path}


def _masked_whole(record: SampleRecord, tokens: list[int]) -> bool:
    """`tokens` occur together in the response, all under loss mask 0."""
    if not tokens:
        return True
    ids, mask, size = record.response_ids, record.loss_mask, len(tokens)
    start = 0
    while True:
        try:
            p = ids.index(tokens[0], start)
        except ValueError:
            return False
        if ids[p: p + size] == tokens and not any(mask[p: p + size]):
            return True
        start = p + 1


def _logprob_problem(have: float | None, served: float) -> str | None:
    have_number = have is not None and not math.isnan(have)
    if math.isnan(served):  # none shown; vLLM's chat and token routes write that as its -9999.0 sentinel
        return "invented" if have_number and have != NO_LOGPROB_SENTINEL else None
    if not have_number:
        return "missing"
    assert have is not None
    return None if abs(have - served) <= ABS_TOL + REL_TOL * abs(served) else "differs"


def _where(entry: ServedEntry) -> dict[str, Any]:
    request = entry.record
    return {"request": request.seq, "rid": request.rid, "trajectory": request.trajectory, "turn": request.turn,
            "attempt": request.attempt}


def _logprob_violation(view: RunView, record: SampleRecord, problem: str, k: int, i: int, have: float | None,
                       served: float, entry: ServedEntry, offset: int) -> Violation:
    where = _where(entry)
    said = {"invented": "a logprob where the answer showed none", "missing": "no logprob where the answer showed one",
            "differs": "a logprob other than the one served"}[problem]
    message = (f"model token {k} (response position {i}) carries {said}: got {have!r}, served "
               f"{None if math.isnan(served) else served!r} by request {where['request']} (turn {where['turn']}, "
               f"attempt {where['attempt']})")
    evidence = {"check": TOKENS_AND_LOGPROBS, "kind": f"logprob {problem}", "position": k, "response_index": i,
                "expected": None if math.isnan(served) else served, "got": have, "served_by": where | {"from": offset},
                "got_from": where | {"from": offset}, "composition": None, "tolerance": LOGPROB_TOLERANCE}
    return Violation(NAME, record.trajectory, message, evidence, _fault_behind(view, record, [entry]))


def _fault_behind(view: RunView, record: SampleRecord, served_by: list[ServedEntry]) -> dict[str, Any] | None:
    """The fault that altered what the mismatching token's request served (else one on an earlier request of
    its chain; else the trajectory's last): not whatever fault hit the trajectory last."""
    events = view.faults_for(record.trajectory)
    for entry in reversed(served_by):
        hit = [e for e in events if e.request_id == entry.record.rid]
        if hit:
            return asdict(hit[-1])
    return preceding(view, record.trajectory, record)


def _token_violation(view: RunView, served: ServedTokens, record: SampleRecord, positions: list[int], got: list[int],
                     expected: list[int], origin: list[tuple[int, int]], chain: list[ServedEntry],
                     alternatives: list[ServedEntry]) -> Violation:
    first = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    segments = compose(served, record.trajectory, got, chain, alternatives)
    at = next((s for s in segments if s.start <= first < s.start + s.length), None)
    served_by = _where(chain[origin[first][0]]) | {"from": origin[first][1]} if first < len(expected) else None
    got_from = None
    if at is not None and at.entry is not None:
        got_from = _where(at.entry) | {"from": at.offset + first - at.start}
    kind, summary = _explain(segments, got, expected, record.trajectory, alternatives)
    response_index = positions[first] if first < len(positions) else None
    message = (f"{summary}; first difference at model token {first} (response position {response_index}): "
               f"got {got[first] if first < len(got) else 'nothing'}, served "
               f"{expected[first] if first < len(expected) else 'nothing'}"
               + (f" by request {served_by['request']} (turn {served_by['turn']}, attempt {served_by['attempt']})"
                  if served_by else ""))
    evidence = {"check": TOKENS_ONLY, "kind": kind, "position": first, "response_index": response_index,
                "expected": expected[first] if first < len(expected) else None,
                "got": got[first] if first < len(got) else None, "served_by": served_by, "got_from": got_from,
                "composition": [s.describe() for s in segments[:20]] + ([{"more": len(segments) - 20}]
                                                                         if len(segments) > 20 else []),
                "final_attempt": [_where(e) | {"tokens": e.count} for e in chain]}
    upto = chain[: origin[first][0] + 1] if first < len(expected) else chain
    return Violation(NAME, record.trajectory, message, evidence, _fault_behind(view, record, upto))


def _explain(segments: list[Segment], got: list[int], expected: list[int], trajectory: str,
             alternatives: Sequence[ServedEntry] = ()) -> tuple[str, str]:
    """The kind of mismatch and a sentence saying it, from where the sample's tokens came from."""
    maybe_mine = {e.index for e in alternatives}
    others = [s for s in segments if s.entry is not None and s.entry.trajectory != trajectory
              and s.entry.index not in maybe_mine]
    if others:
        names = sorted({str(s.entry.trajectory) for s in others if s.entry is not None})
        return "another trajectory", (f"{sum(s.length for s in others)} model tokens were served to another "
                                      f"trajectory ({', '.join(names)})")
    earlier = [s for s in segments if s.entry is not None and not s.in_final]
    if earlier:
        request = earlier[0].entry.record  # type: ignore[union-attr]
        return "earlier attempt", (f"{sum(x.length for x in earlier)} model tokens come from a request its final "
                                   f"attempt did not build on (request {request.seq}: turn {request.turn}, "
                                   f"attempt {request.attempt})")
    used: dict[tuple[int, int], int] = {}
    for s in segments:
        if s.entry is not None:
            for offset in range(s.offset, s.offset + s.length):
                used[(s.entry.index, offset)] = used.get((s.entry.index, offset), 0) + 1
    repeated = sum(1 for n in used.values() if n > 1)
    if repeated:
        return "repeated", f"{repeated} served tokens appear more than once"
    never = sum(s.length for s in segments if s.entry is None)
    if never:
        return "never served", f"{never} model tokens (loss mask 1) were never served"
    if len(got) < len(expected):
        return "missing", f"{len(expected) - len(got)} tokens served to its final attempt are missing"
    return "order", "the model tokens are served tokens out of order"


def compose(served: ServedTokens, trajectory: str, got: Sequence[int], chain: list[ServedEntry],
            alternatives: Sequence[ServedEntry] = ()) -> list[Segment]:
    """Split `got` into runs of served tokens, greedily: the longest run first; on a tie, a run that is a whole
    answer, then one that continues the previous run, then one of this trajectory, then the final attempt.
    `alternatives`: answers that may have been this trajectory's (its group's identical requests)."""
    final = {e.index for e in chain}
    next_in_chain = {e.index: chain[i + 1] for i, e in enumerate(chain[:-1])}
    mine = {e.index: e for e in [*served.of_trajectory(trajectory), *alternatives] if e.count}
    own = [mine[i] for i in sorted(mine)]
    others = _OtherRuns(served, trajectory)
    segments: list[Segment] = []
    p = 0
    while p < len(got):
        previous = segments[-1] if segments else None
        best: tuple[tuple[int, ...], Segment] | None = None
        for entry in own:
            tokens = served.tokens(entry)
            for offset in (o for o in range(entry.count) if tokens[o] == got[p]):
                length = _run(tokens, offset, got, p)
                continues = _continues(previous, entry, offset, chain, next_in_chain)
                if length < min(_MIN_RUN, len(got) - p) and not continues:
                    continue
                key = (length, int(offset == 0 and length == entry.count), continues, int(entry.index in final))
                if best is None or key > best[0]:
                    best = (key, Segment(p, length, entry, offset, entry.index in final))
        if best is None:
            found = others.longest(got, p)
            if found is not None and found[2] >= min(_MIN_RUN, len(got) - p):
                entry, offset, length = found
                best = ((length,), Segment(p, length, entry, offset, False))
        if best is None:
            if previous is not None and previous.entry is None:
                segments[-1] = Segment(previous.start, previous.length + 1)
            else:
                segments.append(Segment(p, 1))
            p += 1
            continue
        segments.append(best[1])
        p += best[1].length
    return _earlier_copies(served, segments, own)


def _earlier_copies(served: ServedTokens, segments: list[Segment], own: list[ServedEntry]) -> list[Segment]:
    """A run of the final attempt used more than once is, but for its last use, better explained by an earlier
    attempt that was served the same tokens (a replay serves every attempt the same answer): a stale retry
    shows as the earlier attempt's tokens kept, not as the final attempt's tokens repeated."""
    uses: dict[int, int] = {}
    for segment in segments:
        if segment.entry is not None and segment.in_final:
            uses[segment.entry.index] = uses.get(segment.entry.index, 0) + 1
    out = []
    for segment in segments:
        entry = segment.entry
        if entry is not None and segment.in_final and uses[entry.index] > 1:
            uses[entry.index] -= 1
            run = served.tokens(entry)[segment.offset: segment.offset + segment.length]
            earlier = next((e for e in own if e.index < entry.index and not _in_chain_of(e, segments)
                            and served.tokens(e)[segment.offset: segment.offset + segment.length] == run), None)
            if earlier is not None:
                segment = Segment(segment.start, segment.length, earlier, segment.offset, False)
        out.append(segment)
    return out


def _in_chain_of(entry: ServedEntry, segments: list[Segment]) -> bool:
    return any(s.entry is not None and s.in_final and s.entry.index == entry.index for s in segments)


def _continues(previous: Segment | None, entry: ServedEntry, offset: int, chain: list[ServedEntry],
               next_in_chain: dict[int, ServedEntry]) -> int:
    """2: the run goes on where the previous one stopped (the same answer, or the next answer of the final
    attempt after a whole one); 1: it starts the next answer of the final attempt, the previous one cut short;
    0: neither."""
    if previous is None:
        first = next((e.index for e in chain if e.count), -1)
        return 2 if entry.index == first and offset == 0 else 0
    if previous.entry is None:
        return 0
    if previous.entry.index == entry.index:
        return 2 if offset == previous.offset + previous.length else 0
    follower = next_in_chain.get(previous.entry.index)
    while follower is not None and not follower.count:
        follower = next_in_chain.get(follower.index)
    if follower is None or follower.index != entry.index or offset != 0:
        return 0
    return 2 if previous.offset + previous.length == previous.entry.count else 1


def _run(tokens: Sequence[int], offset: int, got: Sequence[int], p: int) -> int:
    length = 0
    while offset + length < len(tokens) and p + length < len(got) and tokens[offset + length] == got[p + length]:
        length += 1
    return length


@dataclass
class _OtherRuns:
    """Finds a run of tokens in what other trajectories were served (numpy over the flat array, built once)."""

    served: ServedTokens
    trajectory: str
    _arrays: Any = field(default=None, init=False)

    def longest(self, got: Sequence[int], p: int) -> tuple[ServedEntry, int, int] | None:
        import numpy as np

        if self._arrays is None:
            entries = [e for e in self.served.entries if e.count and e.trajectory != self.trajectory]
            ids = np.frombuffer(self.served.ids, dtype=np.int32) if len(self.served.ids) else np.zeros(0, np.int32)
            starts = np.array([e.offset for e in entries], dtype=np.int64)
            self._arrays = (ids, entries, starts)
        ids, entries, starts = self._arrays
        width = min(_MIN_RUN, len(got) - p)
        if not entries or len(ids) < width:
            return None
        hits = np.ones(len(ids) - width + 1, dtype=bool)
        for j in range(width):
            hits &= ids[j: len(ids) - width + 1 + j] == got[p + j]
        best: tuple[ServedEntry, int, int] | None = None
        for position in np.flatnonzero(hits)[:1000]:
            k = int(np.searchsorted(starts, position, side="right")) - 1
            if k < 0:
                continue
            entry = entries[k]
            offset = int(position) - entry.offset
            if not 0 <= offset < entry.count or offset + width > entry.count:
                continue
            length = _run(self.served.tokens(entry), offset, got, p)
            if best is None or length > best[2]:
                best = (entry, offset, length)
        return best


def _assess_text(view: RunView, served: ServedTokens, record: SampleRecord, positions: list[int],
                 chain: list[ServedEntry]) -> Assessment:
    """A re-tokenising framework: its model text must be the text it was served, in order."""
    decode = view.decode
    if decode is None:
        return Assessment(record.trajectory, NOT_CHECKED, NONE, "no tokenizer to compare text with")
    runs: list[list[int]] = []
    for k, i in enumerate(positions):
        if k and i == positions[k - 1] + 1:
            runs[-1].append(record.response_ids[i])
        else:
            runs.append([record.response_ids[i]])
    got = "".join(decode(run) for run in runs)
    expected = "".join(decode(list(served.tokens(e))) for e in chain)
    note = "re-tokenized: text compared, logprobs not"
    if got == expected or (record.outcome == "truncated" and expected.startswith(got)):
        return Assessment(record.trajectory, MATCH, TEXT, note)
    first = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    evidence = {"check": TEXT, "kind": "text", "position": first, "response_index": None,
                "expected": expected[max(0, first - 20): first + 40], "got": got[max(0, first - 20): first + 40],
                "served_by": None, "got_from": None, "composition": None,
                "final_attempt": [_where(e) | {"tokens": e.count} for e in chain]}
    message = (f"the model text (loss mask 1) differs from the text served to its final attempt at character "
               f"{first}: got {got[first: first + 30]!r}, served {expected[first: first + 30]!r}")
    violation = Violation(NAME, record.trajectory, message, evidence, preceding(view, record.trajectory, record))
    return Assessment(record.trajectory, MISMATCH, TEXT, note, violation)
