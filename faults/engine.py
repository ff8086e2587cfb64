"""The fault engine: which rules fire for a request, applied to its exchange, logged.

The plan can be swapped at any time (on the event loop, between two decisions: atomic);
a request can also force faults with the `X-Bench-Fault` header, for debugging.

`window` schedules count seconds from the first request the plan decides about (the target's
first request in a run; with `serve`, the first one after the plan was loaded or swapped in), so
a framework that imports torch or starts Ray inside its rollout does not eat an outage window
before it sends anything. A plan saying `window_from = "server_start"` counts from the server's
start instead, which `run` moves to the moment the target's worker is loaded (`start_clock`).
"""

from __future__ import annotations

import operator
import random
import time
from collections import deque
from dataclasses import dataclass
from hashlib import blake2b
from itertools import compress, repeat
from typing import Any

from .base import Fault, FaultError
from .exchange import Exchange
from .log import FaultEvent, FaultLog
from .plan import SERVER_START, Plan, PlanError, Rule, parse_spec, make_rule
from .schedule import SCHEDULE_KEYS, Target, uniform

FAULT_HEADER = "X-Bench-Fault"
EMPTY_PLAN = Plan("none", 0, ())


@dataclass(frozen=True)
class Decision:
    rules: tuple[Rule, ...]
    target: Target


def forced_rules(header: str) -> tuple[Rule, ...]:
    """Rules from an `X-Bench-Fault` header: `;`-separated specs without schedules."""
    rules = []
    for index, spec in enumerate(s.strip() for s in header.split(";") if s.strip()):
        values = parse_spec(spec)
        scheduled = sorted(set(values) & set(SCHEDULE_KEYS))
        if scheduled:
            raise FaultError(f"{FAULT_HEADER}: {spec!r}: a forced fault takes no schedule ({', '.join(scheduled)})")
        rule = make_rule(values, f"header:{values['fault']}#{index}")
        if not rule.fault.server_side or rule.fault.on_weight_update:
            where = "the target adapter" if not rule.fault.server_side else "weight updates"
            raise FaultError(f"{FAULT_HEADER}: {spec!r}: {rule.fault.name} acts in {where}, not on one request; "
                             "put it in a plan instead")
        rules.append(rule)
    return tuple(rules)


class FaultEngine:
    def __init__(self, plan: Plan | None = None) -> None:
        self.plan = plan or EMPTY_PLAN
        self.log = FaultLog()
        self.server_started = time.monotonic()  # what `window_from = "server_start"` plans count from
        self.first_request: float | None = None  # the current plan's first decision: what the others count from
        self._watched: dict[str, list[tuple[FaultEvent, Fault]]] = {}  # trajectory -> events to look out for
        self.consumed: set[tuple[str, str, str, int, int]] = set()  # identities of events the client acted on
        self._compiled: CompiledPlan | None = None  # the plan's rules, sorted per place once (`decide`)

    def start_clock(self) -> None:
        """`server_start` windows count from now: the runner calls this once the target is loaded, so a
        framework's slow imports (seconds for torch, verifiers) do not eat an outage window."""
        self.server_started = time.monotonic()

    def swap(self, plan: Plan, *, keep_clock: bool = False) -> Plan:
        """Replace the plan; returns the old one. Decisions already taken keep their rules; the new plan's
        windows count from its own first request (or from the server's start, if it says so), or, with
        `keep_clock`, from the replaced plan's: the same run's plan narrowed to a step's rules."""
        old, self.plan = self.plan, plan
        if not keep_clock:
            self.first_request = None
        return old

    def elapsed(self, plan: Plan) -> float:
        """Seconds into the plan's windows; the first request of a `first_request` plan is at 0."""
        now = time.monotonic()
        if self.first_request is None:
            self.first_request = now
        return now - (self.server_started if plan.window_from == SERVER_START else self.first_request)

    def decide(self, target: Target, forced: tuple[Rule, ...] = ()) -> Decision:
        plan = self.plan  # one read: a concurrent swap never mixes two plans in one decision
        elapsed = self.elapsed(plan)
        compiled = self._compiled
        if compiled is None or compiled.plan is not plan:
            compiled = self._compiled = CompiledPlan(plan)
        fired = compiled.fired(target, elapsed)
        return Decision(tuple(forced) + fired if forced else fired, target)

    def fired_at(self, trajectory: str, index: int | None, group: str | None, turn: int, attempt: int,
                 endpoint: str, api: str | None = None) -> tuple[Rule, ...]:
        """`decide(Target(...)).rules`, without making the target or the decision (the server's fast path asks this
        on every request, and nearly always nothing fires). With `api`, less the rules whose fault does not act on
        that API (`apply` passes them by: deciding them would only cost their hash)."""
        plan = self.plan
        elapsed = self.elapsed(plan)
        compiled = self._compiled
        if compiled is None or compiled.plan is not plan:
            compiled = self._compiled = CompiledPlan(plan)
        return compiled.fired_fields(trajectory, index, group, turn, attempt, endpoint, elapsed, api=api)

    def apply(self, decision: Decision, exchange: Exchange, request_id: str) -> None:
        """Apply each fired rule to the exchange and log what it changed.

        Only what reaches the client is logged. An answer that replaces the generation masks
        every other rule: the last error status set, else the last refusal, else a reset (the
        order in which the server honours them). A turn the recording answers with an error
        masks every rule that does not answer in its place.
        """
        target = decision.target
        events: list[FaultEvent] = []
        answered_by: dict[str, FaultEvent] = {}  # which rule last set each kind of replacing answer
        for rule in decision.rules:
            if exchange.api not in rule.fault.apis:
                continue
            exchange.rng = random.Random(uniform(self.plan.seed, rule.name, target))
            before = (exchange.replacement, exchange.refusal_context, exchange.transport.reset)
            change = rule.fault.apply(exchange)
            event = FaultEvent(rule.name, rule.fault.name, target.trajectory, target.group, target.turn,
                               target.attempt, target.endpoint, request_id, time.time(), change)
            events.append(event)
            if exchange.replacement is not before[0]:
                answered_by["replacement"] = event
            if exchange.refusal_context != before[1]:
                answered_by["refusal"] = event
            if exchange.transport.reset != before[2]:
                answered_by["reset"] = event
        if exchange.preempted():
            kind = ("replacement" if exchange.replacement is not None
                    else "refusal" if exchange.refusal_context is not None else "reset")
            events = [answered_by[kind]]
        elif exchange.refused_anyway():
            events = []  # the recorded error answers; nothing the rules did shows
        for event in events:
            self.log.append(event)
        faults = {r.name: r.fault for r in decision.rules}
        for event in events:
            if faults[event.rule].watches_later:
                self._watched.setdefault(event.trajectory, []).append((event, faults[event.rule]))

    def preempts(self, decision: Decision, scratch: Exchange) -> bool:
        """Whether the decided rules answer in the generation's place (an error status, a context refusal, a
        dropped connection): the fault proxy then never asks its live engine, as a router that answers 503 never
        reaches one. `scratch` is a throwaway exchange; nothing is logged (`apply` logs, on the real one)."""
        for rule in decision.rules:
            if scratch.api in rule.fault.apis:
                scratch.rng = random.Random(uniform(self.plan.seed, rule.name, decision.target))
                rule.fault.apply(scratch)
        return scratch.preempted()

    def observe(self, trajectory: str | None, later_request: bytes, tokenizer: object) -> None:
        """A request of `trajectory` arrived: does it show the client acted on a faulted answer it got before?"""
        watched = self._watched.get(trajectory or "")
        if not watched:
            return
        for event, fault in list(watched):
            if fault.consumed_in(later_request, tokenizer):
                self.consumed.add(event.identity)
                watched.remove((event, fault))

    def never_fired(self) -> list[str]:
        return self.log.never_fired(r.name for r in self.plan.rules if r.fault.server_side)


class CompiledPlan:
    """A plan's request rules, ready for deciding on every request at little cost, with exactly the decisions of
    `Schedule.fires` (in plan order): the conditions that depend only on where a request is (trajectory, group, turn,
    endpoint, trajectory index) are checked once per place, and a probability is compared against the same hash
    `uniform` takes, as bytes (big-endian: the same order as the integer), from a hash state per rule that already
    holds its key's start. A place whose rules need only that (no attempt or time condition, the usual case) is
    decided with the loops in C (`map`, `compress`): a chaos plan asks 22 hashes of every turn-0 request."""

    _PLACES = 100_000  # places remembered (unknown requests each make one: bounded)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.rules = tuple(r for r in plan.rules if r.fault.server_side and not r.fault.on_weight_update)
        # per rule: its `uniform` hash with the key's start already hashed (each request copies it and hashes only its
        # own part: half the cost of hashing the whole key), and its probability as a bound on the hash's bytes
        self._keys = tuple(blake2b(f"{plan.seed}\x00{r.name}\x00".encode(), digest_size=8)
                           if r.schedule.p is not None else None for r in self.rules)
        self._bounds = tuple(_bound(_threshold(r.schedule._threshold)) if r.schedule.p is not None else _ALWAYS
                             for r in self.rules)
        self._places: dict[tuple[object, ...], _Place] = {}

    def fired(self, target: Target, elapsed: float) -> tuple[Rule, ...]:
        return self.fired_fields(target.trajectory, target.index, target.group, target.turn, target.attempt,
                                 target.endpoint, elapsed, target)

    def fired_fields(self, trajectory: str, index: int | None, group: str | None, turn: int, attempt: int,
                     endpoint: str, elapsed: float, target: Target | None = None, *, api: str | None = None
                     ) -> tuple[Rule, ...]:
        """The rules that fire for the target of these fields (made only if a rule's schedule needs it whole); with
        `api`, only those whose fault acts on that API."""
        if not self.rules:
            return ()
        place = (trajectory, index, group, turn, endpoint, api)
        found = self._places.get(place)
        if found is None:
            found = self._place(trajectory, index, group, turn, endpoint, api)
            if len(self._places) >= self._PLACES:
                self._places.clear()
            self._places[place] = found
        rules, states, bounds, simple = found
        if not rules:
            return ()
        suffix = f"{trajectory}\x00{turn}\x00{attempt}".encode()
        if simple:  # every rule fires on its hash alone: copy, update and compare in C
            hashes = list(map(_copy, states))
            _consume(map(_update, hashes, repeat(suffix, len(hashes))), 0)
            return tuple(compress(rules, map(_lt, map(_digest, hashes), bounds)))
        fired = []
        for rule, started, bound in zip(rules, states, bounds):
            if rule.schedule.attempts is not None or rule.schedule.first is not None or rule.schedule.window is not None:
                if target is None:
                    target = Target(trajectory, index, group, turn, attempt, endpoint)
                if rule.schedule.fires(self.plan.seed, rule.name, target, elapsed):
                    fired.append(rule)
                continue
            hashed = started.copy()
            hashed.update(suffix)
            if hashed.digest() < bound:
                fired.append(rule)
        return tuple(fired)

    def _place(self, trajectory: str, index: int | None, group: str | None, turn: int, endpoint: str,
               api: str | None = None) -> "_Place":
        """The rules whose place conditions hold for the target (and whose fault acts on `api`, if given), each with
        its started hash (a shared blank one for a rule with no probability, whose bound every hash is below) and its
        bound, and whether that is all left to check for each (no attempt or time condition)."""
        rules, states, bounds = [], [], []
        for rule, key, bound in zip(self.rules, self._keys, self._bounds):
            s = rule.schedule
            if (api is not None and api not in rule.fault.apis
                    or s.endpoints is not None and endpoint not in s.endpoints
                    or s.trajectories is not None and trajectory not in s.trajectories
                    or s.groups is not None and group not in s.groups
                    or s.turns is not None and turn not in s.turns
                    or s.every is not None and (index is None or (index + 1) % s.every)):
                continue
            rules.append(rule)
            states.append(_BLANK if key is None else key)
            bounds.append(bound)
        simple = all(r.schedule.attempts is None and r.schedule.first is None and r.schedule.window is None
                     for r in rules)
        return tuple(rules), tuple(states), tuple(bounds), simple


_Place = tuple[tuple[Rule, ...], tuple[Any, ...], tuple[bytes, ...], bool]
_BLANK = blake2b(digest_size=8)  # hashed for a rule with no probability: its bound lets every digest through
_ALWAYS = b"\xff" * 9  # above every 8-byte digest (a digest of eight 0xff bytes is a prefix of it, so below it)
_copy, _update, _digest = type(_BLANK).copy, type(_BLANK).update, type(_BLANK).digest
_lt = operator.lt
_consume = deque  # deque(iterator, 0): runs it through in C, keeping nothing


def _bound(threshold: int) -> bytes:
    """`threshold` (a fire happens when the digest, as a big-endian integer, is below it) as bytes that 8-byte
    digests compare against in the same order: 2**64 (every digest) is above all of them, 0 below all."""
    return _ALWAYS if threshold >= 2**64 else threshold.to_bytes(8, "big")


def _threshold(p: float) -> int:
    """The least 64-bit hash value h with h / 2**64 >= p: `uniform(...) < p` exactly when h < this."""
    low, high = 0, 2**64
    while low < high:
        middle = (low + high) // 2
        if middle / 2**64 < p:
            low = middle + 1
        else:
            high = middle
    return low


__all__ = ["CompiledPlan", "Decision", "FAULT_HEADER", "FaultEngine", "PlanError", "forced_rules"]
