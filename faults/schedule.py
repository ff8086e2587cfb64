"""When a rule fires: a pure function of (plan seed, rule, trajectory, turn, attempt).

Nothing here reads a counter or the arrival order, so a run under any concurrency fires the
same events as a serial one. The one exception is `window`, which is time on purpose (an
outage lasting T seconds).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterator

SCHEDULE_KEYS = ("p", "every", "first", "trajectories", "groups", "turns", "attempts", "window", "endpoints", "steps")


@dataclass(frozen=True)
class Target:
    """What a decision is about: one attempt at one turn of one trajectory, at one endpoint."""

    trajectory: str  # trajectory id, or a digest of the request when no trajectory matched
    index: int | None  # the trajectory's position in the trace
    group: str | None
    turn: int
    attempt: int
    endpoint: str


def uniform(seed: int, rule: str, target: Target) -> float:
    """A number in [0, 1) fixed by the seed, the rule and the attempt's identity."""
    key = f"{seed}\x00{rule}\x00{target.trajectory}\x00{target.turn}\x00{target.attempt}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64


@dataclass(frozen=True, eq=False)
class IntRanges:
    """Non-negative integers as sorted, disjoint, inclusive (low, high) ranges: `turns = "0-3000000"` costs two numbers,
    not a set of three million (205 MB and seconds to build). `in` is a bisection."""

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, pairs: list[tuple[int, int]]) -> "IntRanges":
        merged: list[tuple[int, int]] = []
        for low, high in sorted(pairs):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        return cls(tuple(merged))

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        index = bisect.bisect_right(self.ranges, (value, _BEYOND)) - 1
        return index >= 0 and value <= self.ranges[index][1]

    def __len__(self) -> int:
        return self.count()

    def count(self) -> int:
        """How many members (an int of any size: `len` is bounded by sys.maxsize)."""
        return sum(high - low + 1 for low, high in self.ranges)

    def __eq__(self, other: object) -> bool:
        """Equal to the same ranges, or to a set of exactly these members (what schedules held before)."""
        if isinstance(other, IntRanges):
            return self.ranges == other.ranges
        if isinstance(other, (set, frozenset)):
            return len(other) == self.count() and all(value in self for value in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __iter__(self) -> Iterator[int]:
        for low, high in self.ranges:
            yield from range(low, high + 1)

    def describe(self) -> list[int] | str:
        """A list when short (as plans usually write it), else the ranges as text (`"0-3000000"`), which reads back."""
        if self.count() <= _LISTED:
            return list(self)
        return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in self.ranges)


_CEILING = 2**62  # turns and attempts past this are not counted by anything: a plan naming them is a typo
_BEYOND = 2**63  # sorts after any `high`, so bisect finds the range that starts at or before a value
_LISTED = 64


@dataclass(frozen=True)
class Schedule:
    """Conditions that must all hold for a rule to fire; an empty schedule always fires."""

    p: Fraction | None = None
    every: int | None = None
    first: int | None = None
    trajectories: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    turns: IntRanges | None = None
    attempts: IntRanges | None = None
    window: tuple[float, float] | None = None  # [start, end) seconds since the plan's first request (FaultEngine)
    endpoints: frozenset[str] | None = None
    # training steps (`run --steps K`, 0 to K-1) the rule is in the plan for: the step driver (`bench.steps`) puts
    # it in the server's plan only during those steps, so `fires` does not look at it; outside `run` it is ignored
    steps: IntRanges | None = None

    def fires(self, seed: int, rule: str, target: Target, elapsed: float) -> bool:
        if self.endpoints is not None and target.endpoint not in self.endpoints:
            return False
        if self.trajectories is not None and target.trajectory not in self.trajectories:
            return False
        if self.groups is not None and target.group not in self.groups:
            return False
        if self.turns is not None and target.turn not in self.turns:
            return False
        if self.attempts is not None and target.attempt not in self.attempts:
            return False
        if self.first is not None and target.attempt > self.first:
            return False
        if self.every is not None and (target.index is None or (target.index + 1) % self.every):
            return False
        if self.window is not None and not self.window[0] <= elapsed < self.window[1]:
            return False
        return self.p is None or uniform(seed, rule, target) < self._threshold

    @property
    def _threshold(self) -> float:
        """`p` as a float, computed once: decisions sit on every request's path."""
        cached = self.__dict__.get("_p_float")
        if cached is None:
            cached = float(self.p)  # type: ignore[arg-type]
            object.__setattr__(self, "_p_float", cached)
        return cached

    def scaled(self, factor: float) -> "Schedule":
        """The same schedule with its probability multiplied (for fault-rate sweeps), capped at 1."""
        if self.p is None:
            return self
        return dataclasses.replace(self, p=min(Fraction(1), self.p * Fraction(factor).limit_denominator()))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in SCHEDULE_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = str(value) if isinstance(value, Fraction) else (
                    sorted(value) if isinstance(value, frozenset) else
                    value.describe() if isinstance(value, IntRanges) else value)
        return out


class ScheduleError(ValueError):
    """A schedule value that cannot mean anything (names the key)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def _ints(key: str, value: Any) -> IntRanges:
    """`3`, `[0, 2]`, `"0,2,5-7"` -> a set of ints, as ranges."""
    items = value if isinstance(value, list) else str(value).split(",")
    pairs: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ScheduleError(key, f"expected integers or ranges like 0,2,5-7; got {value!r}")
        text = str(item).strip()
        try:
            low, high = (int(v) for v in text.split("-", 1)) if "-" in text.lstrip("-") else (int(text),) * 2
        except ValueError:
            raise ScheduleError(key, f"expected integers or ranges like 0,2,5-7; got {value!r}") from None
        if high < low:
            raise ScheduleError(key, f"range {text!r} ends before it starts; got {value!r}")
        if high >= _CEILING:
            raise ScheduleError(key, f"{high} is past the largest {key[:-1]} a plan can name ({_CEILING - 1}); "
                                f"got {value!r}")
        pairs.append((low, high))
    if not pairs or min(low for low, _ in pairs) < 0:
        raise ScheduleError(key, f"needs one or more non-negative integers; got {value!r}")
    return IntRanges.of(pairs)


def _strings(key: str, value: Any) -> frozenset[str]:
    items = value if isinstance(value, list) else str(value).split(",")
    out = frozenset(str(i).strip() for i in items if str(i).strip())
    if not out:
        raise ScheduleError(key, "needs at least one name")
    return out


def _probability(value: Any) -> Fraction:
    try:
        p = Fraction(str(value)) if not isinstance(value, float) else Fraction(value).limit_denominator(10**9)
    except (ValueError, ZeroDivisionError):
        raise ScheduleError("p", f"expected a probability like 0.01 or 1/400; got {value!r}") from None
    if not 0 < p <= 1:
        raise ScheduleError("p", f"must be in (0, 1]; got {value!r}")
    return p


def _positive(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit() or int(value) < 1:
        raise ScheduleError(key, f"must be a positive integer; got {value!r}")
    return int(value)


def _window(value: Any) -> tuple[float, float]:
    items = value if isinstance(value, list) else str(value).split("-")
    try:
        start, end = (float(v) for v in items)
    except (ValueError, TypeError):
        raise ScheduleError("window", f"expected [start, end] seconds or 'start-end'; got {value!r}") from None
    if not 0 <= start < end:
        raise ScheduleError("window", f"needs 0 <= start < end; got {value!r}")
    return start, end


def parse_schedule(values: dict[str, Any]) -> Schedule:
    """A Schedule from plan-file or command-line values (already split from fault parameters)."""
    parsed: dict[str, Any] = {}
    for key, value in values.items():
        if key == "p":
            parsed[key] = _probability(value)
        elif key in ("every", "first"):
            parsed[key] = _positive(key, value)
        elif key in ("turns", "attempts", "steps"):
            parsed[key] = _ints(key, value)
        elif key in ("trajectories", "groups", "endpoints"):
            parsed[key] = _strings(key, value)
        elif key == "window":
            parsed[key] = _window(value)
        else:
            raise ScheduleError(key, f"unknown schedule key; valid: {', '.join(SCHEDULE_KEYS)}")
    if "attempts" in parsed and 0 in parsed["attempts"]:
        raise ScheduleError("attempts", "attempts count from 1")
    return Schedule(**parsed)
