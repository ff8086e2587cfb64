"""A sample's trained tokens (loss mask 1) as NumPy arrays, worked out once per record for every check that reads
them: token alignment and provenance would otherwise each take a Python step per token.

Each conversion is exact or refuses: a field is None when a value is not of a type it converts without changing
what a comparison in Python says (a check then takes its token-by-token path). Records from a worker are decoded
JSON (plain ints, floats and None), so arrays are the usual case. Only trained positions are gathered (a slice per run):
a tool loop's response is mostly tool output under loss mask 0.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bench.records.sample import SampleRecord

_MEMO = "trained tokens"
_FLOATS = frozenset({float, int})
_FLOATS_OR_NONE = frozenset({float, int, type(None)})


@dataclass(frozen=True)
class Trained:
    """A record's loss-mask-1 positions, and its response ids and logprobs there."""

    positions: np.ndarray  # int64, ascending
    ids: np.ndarray | None  # int64; None: an id is not an integer or does not fit
    # float64, NaN where the record has None or no logprob at that position; None: the record has no logprobs, or
    # one there is of another type (a NumPy scalar, a string)
    logprobs: np.ndarray | None


def trained(memo: dict[str, Any], record: SampleRecord) -> Trained:
    """The record's trained tokens, computed once per view (`memo`: the view's)."""
    cache: dict[int, tuple[SampleRecord, Trained]] = memo.setdefault(_MEMO, {})
    hit = cache.get(id(record))
    if hit is not None and hit[0] is record:
        return hit[1]
    positions = trained_positions(record.loss_mask)
    runs = _runs(positions)
    found = Trained(positions, _gather_ints(record.response_ids, positions, runs),
                    None if record.logprobs is None else _gather_floats(record.logprobs, positions, runs))
    cache[id(record)] = (record, found)
    return found


def trained_positions(loss_mask: Sequence[object]) -> np.ndarray:
    """The positions whose loss mask is true (truthiness, as `if m` reads it), in order."""
    try:
        flags = np.frombuffer(bytes(loss_mask), dtype=np.uint8)  # type: ignore[arg-type]  # ints 0..255: C speed
    except (TypeError, ValueError):
        return np.array([i for i, m in enumerate(loss_mask) if m], dtype=np.int64)
    return np.flatnonzero(flags)


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """The positions as (start, end) runs of consecutive ones: a turn's answer is one."""
    if len(positions) == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate(([0], breaks))].tolist()
    ends = (positions[np.concatenate((breaks - 1, [len(positions) - 1]))] + 1).tolist()
    return list(zip(starts, ends))


def _gather(values: Sequence[object], runs: list[tuple[int, int]]) -> list[object]:
    """`[values[i] for i in positions]`, a slice per run."""
    picked: list[object] = []
    for start, end in runs:
        picked += values[start:end]
    return picked


def _gather_ints(values: Sequence[object], positions: np.ndarray, runs: list[tuple[int, int]]) -> np.ndarray | None:
    if len(positions) and positions[-1] >= len(values):
        return None
    try:
        return np.frombuffer(array("q", _gather(values, runs)), dtype=np.int64)  # type: ignore[arg-type]
    except (TypeError, OverflowError):
        return None


def _gather_floats(values: Sequence[object], positions: np.ndarray, runs: list[tuple[int, int]]
                   ) -> np.ndarray | None:
    """NaN for None, and for positions past the end of `values` (slices stop there)."""
    picked = _gather(values, runs)
    kinds = set(map(type, picked))
    if not kinds <= _FLOATS_OR_NONE:
        return None
    if type(None) in kinds:
        picked = [math.nan if v is None else v for v in picked]
    if len(picked) == len(positions):
        return np.frombuffer(array("d", picked), dtype=np.float64)  # type: ignore[arg-type]
    out = np.full(len(positions), math.nan)
    out[: len(picked)] = np.frombuffer(array("d", picked), dtype=np.float64)  # type: ignore[arg-type]
    return out
