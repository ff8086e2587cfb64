"""Provenance against a reference implementation: hypothesis builds what a server served to one trajectory (an
abandoned first attempt, then a final attempt of several turns with tool output between them) and a sample made
from it, honest or altered one way; the invariant must flag the sample exactly when the reference does.

The reference knows the final attempt's turns from the construction; the invariant has to find them from the
served store's links (each request's prompt extends the context it continued), so this checks both."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from bench import SampleRecord
from bench.invariants import RunView
from bench.invariants.provenance import ABS_TOL, REL_TOL, assess
from bench.records.request_log import RequestLog, RequestRecord
from bench.records.served_tokens import ServedTokens
from bench.replay import pack

tokens = st.lists(st.integers(0, 30), min_size=0, max_size=8)
logprob = st.one_of(st.none(), st.floats(-20.0, -0.0001, allow_nan=False))
MUTATIONS = ("none", "change token", "drop token", "insert token", "repeat turn", "earlier attempt first",
             "nudge logprob", "move logprob", "fill missing logprob", "drop logprob", "tool as model", "truncate",
             "mask a turn", "drop a turn", "first turn into the prompt")


@dataclass
class Turn:
    ids: list[int]
    logprobs: list[float | None]
    tool: list[int]


@st.composite
def turns(draw: st.DrawFn, min_size: int = 1) -> list[Turn]:
    out = []
    for _ in range(draw(st.integers(min_size, 4))):
        ids = draw(tokens)
        out.append(Turn(ids, draw(st.lists(logprob, min_size=len(ids), max_size=len(ids))),
                        draw(st.lists(st.integers(31, 40), min_size=1, max_size=4))))
    return out


def serve(final: list[Turn], abandoned: list[Turn]) -> tuple[ServedTokens, list[RequestRecord]]:
    """Requests as a multi-turn client sends them: the abandoned attempt first, then the final one, each turn's
    prompt the previous prompt plus the reply plus the tool output."""
    store, log = ServedTokens(), RequestLog()
    for attempt, path in ((1, abandoned), (2 if abandoned else 1, final)):
        prompt = [1, 2, 3]
        for number, turn in enumerate(path):
            record = RequestRecord(0.0, "/generate", trajectory="t", group="g", turn=number, attempt=attempt)
            log.append(record)
            store.begin(record, pack(prompt))
            store.finish(record, prompt, turn.ids, turn.logprobs, "v1")
            prompt = prompt + turn.ids + turn.tool
    return store, log.records


def sample_of(final: list[Turn]) -> tuple[list[int], list[float | None], list[int]]:
    ids: list[int] = []
    logprobs: list[float | None] = []
    mask: list[int] = []
    for number, turn in enumerate(final):
        ids += turn.ids
        logprobs += turn.logprobs
        mask += [1] * len(turn.ids)
        if number < len(final) - 1:
            ids += turn.tool
            logprobs += [0.0] * len(turn.tool)
            mask += [0] * len(turn.tool)
    return ids, logprobs, mask


def _masked_somewhere(ids: list[int], mask: list[int], tokens: list[int]) -> bool:
    return not tokens or any(ids[p: p + len(tokens)] == tokens and not any(mask[p: p + len(tokens)])
                             for p in range(len(ids)))


def _logprobs_ok(have: list[float | None], want: list[float | None]) -> bool:
    for got, served in zip(have, want, strict=True):
        number = got is not None and not math.isnan(got)
        if served is None:
            if number:
                return False
        elif not number or abs(got - served) > ABS_TOL + REL_TOL * abs(served):
            return False
    return True


def reference(final: list[Turn], ids: list[int], logprobs: list[float | None], mask: list[int],
              outcome: str) -> bool:
    """True when the sample trains on what its final attempt was served (the documented rule), by brute force:
    some choice of trained turns, in order and whole (a truncated sample's last one may be cut), makes the model
    tokens, their logprobs are the served ones, and each turn left out after the first trained one is in the
    response whole under loss mask 0. Every turn is tried first, as the invariant does."""
    positions = [i for i, m in enumerate(mask) if m]
    if not positions:
        return True
    got = [ids[i] for i in positions]
    have = [logprobs[i] for i in positions]
    turns = [turn for turn in final if turn.ids]
    choices = sorted(itertools.product([False, True], repeat=len(turns)), key=lambda c: [not x for x in c])
    for chosen in choices:
        picked = [turn for turn, keep in zip(turns, chosen) if keep]
        if not picked:
            continue
        first = chosen.index(True)
        if not all(_masked_somewhere(ids, mask, turn.ids)
                   for j, turn in enumerate(turns) if j > first and not chosen[j]):
            continue
        served = [t for turn in picked for t in turn.ids]
        served_lp = [lp for turn in picked for lp in turn.logprobs]
        start_of_last = len(served) - len(picked[-1].ids)
        if got == served:
            cut = len(served)
        elif outcome == "truncated" and start_of_last < len(got) < len(served) and served[: len(got)] == got \
                and all(not keep for keep in chosen[turns.index(picked[-1]) + 1:]):
            cut = len(got)
        else:
            continue
        return _logprobs_ok(have, served_lp[:cut])
    return False


@settings(max_examples=400)  # cheap (a few ms each): enough to meet every mutation on every shape, per pull request
@given(final=turns(), abandoned=st.one_of(st.just([]), turns()), mutation=st.sampled_from(MUTATIONS),
       where=st.integers(0, 10_000), nudge=st.sampled_from([1e-6, 1e-2]))
def test_provenance_agrees_with_the_reference(final: list[Turn], abandoned: list[Turn], mutation: str, where: int,
                                              nudge: float) -> None:
    store, requests = serve(final, abandoned)
    ids, logprobs, mask = sample_of(final)
    outcome = "completed"
    model = [i for i, m in enumerate(mask) if m]
    at = model[where % len(model)] if model else None
    if mutation == "change token" and at is not None:
        ids[at] += 1
    elif mutation == "drop token" and at is not None:
        del ids[at], logprobs[at], mask[at]
    elif mutation == "insert token" and at is not None:
        ids.insert(at, 7), logprobs.insert(at, -1.0), mask.insert(at, 1)
    elif mutation == "repeat turn" and final[-1].ids:
        ids += final[-1].ids
        logprobs += final[-1].logprobs
        mask += [1] * len(final[-1].ids)
    elif mutation == "earlier attempt first" and abandoned and abandoned[0].ids:
        ids = abandoned[0].ids + ids
        logprobs = list(abandoned[0].logprobs) + logprobs
        mask = [1] * len(abandoned[0].ids) + mask
    elif mutation == "nudge logprob" and at is not None and logprobs[at] is not None:
        logprobs[at] = logprobs[at] - nudge  # type: ignore[operator]
    elif mutation == "move logprob" and at is not None and len(model) > 1:
        other = model[(where + 1) % len(model)]
        logprobs[at], logprobs[other] = logprobs[other], logprobs[at]
    elif mutation == "fill missing logprob":
        logprobs = [0.0 if lp is None else lp for lp in logprobs]
    elif mutation == "drop logprob" and at is not None:
        logprobs[at] = None
    elif mutation == "tool as model" and 0 in mask:
        mask = [1] * len(mask)
    elif mutation in ("mask a turn", "drop a turn", "first turn into the prompt") and final[0].ids:
        turn = 0 if mutation == "first turn into the prompt" else where % len(final)
        start = sum(len(t.ids) + len(t.tool) for t in final[:turn])
        span = range(start, start + len(final[turn].ids))
        if mutation == "mask a turn":
            mask = [0 if i in span else m for i, m in enumerate(mask)]
        else:  # dropped from the response: lost (a later turn), or moved into the prompt (the first)
            ids, logprobs, mask = ([v for i, v in enumerate(column) if i not in span]
                                   for column in (ids, logprobs, mask))
    elif mutation == "truncate" and model:
        outcome = "truncated"
        keep = where % (len(model) + 1)
        cut = model[keep] if keep < len(model) else len(ids)
        ids, logprobs, mask = ids[:cut], logprobs[:cut], mask[:cut]
    record = SampleRecord("t", "g", outcome, response_ids=ids, loss_mask=mask, response_length=len(ids),
                          logprobs=[math.nan if lp is None else lp for lp in logprobs])
    view = RunView([record], requests, [], None, {"t": "g"}, 10_000, False, served=store)
    verdict = assess(view)["t"]
    expected_ok = reference(final, ids, logprobs, mask, outcome)
    assert (verdict.violation is None) == expected_ok, (mutation, verdict, ids, mask)
