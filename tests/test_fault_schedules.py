"""Fault schedules: reproducible under any concurrency, right on average, every key, clear errors.

Decisions are a pure function of (seed, rule, trajectory, turn, attempt); a replay of the
agentic trace through the server fires the same events serially and with 256 concurrent
clients in random order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import faults.catalogue  # noqa: F401  (registers every fault)
from bench.replay.store import RecordedTrajectory
from bench.server import BenchServer
from faults import (
    FAULTS,
    FaultEngine,
    PlanError,
    Schedule,
    Target,
    load_plan,
    parse_schedule,
    plan_from_specs,
    rule_from_spec,
)
from faults.plan import parse_plan, plan_to_toml
from faults.schedule import ScheduleError
from tests.server_helpers import turn_input

EOS = 1758


# -- (a) determinism through the server ------------------------------------------------------------------------------
SPECS = ["missing_logprobs:p=1/20", "abort:p=1/50", "http_error:status=503,first=1,turns=2-3"]
SEED = 20260
TRAJECTORIES = 256  # one per client; ~1,800 requests per run
MAX_TURNS = 5
CLIENTS = 256
TRIES = 3  # a turn is sent at most 3 times (2 retries), then the trajectory stops


class InFlight:
    def __init__(self) -> None:
        self.now = self.peak = 0

    def __enter__(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


async def _replay(http: aiohttp.ClientSession, url: str, trajectory: RecordedTrajectory, budget: int,
                  inflight: InFlight) -> list[tuple[int, int, int, str]]:
    """Follow the recording turn by turn; retry a failed or aborted turn up to twice, then give up."""
    seen = []
    for turn in range(min(MAX_TURNS, len(trajectory.turns))):
        ids = turn_input(trajectory, turn)
        body = {"input_ids": ids, "return_logprob": True,
                "sampling_params": {"max_new_tokens": max(1, min(2048, budget - len(ids))),
                                    "stop_token_ids": [EOS], "no_stop_trim": True}}
        for attempt in range(1, TRIES + 1):
            with inflight:
                async with http.post(f"{url}/generate", json=body,
                                     headers={"X-Bench-Trajectory": trajectory.id}) as resp:
                    status, data = resp.status, await resp.read()
            finish = json.loads(data)["meta_info"]["finish_reason"]["type"] if status == 200 else "error"
            seen.append((turn, attempt, status, finish))
            if finish in ("stop", "length"):
                break
        else:
            return seen
    return seen


async def _run(concurrency: int, order_seed: int | None) -> tuple[list[Any], dict[str, Any], list[str], int]:
    plan = plan_from_specs(SPECS, SEED, "determinism")
    async with BenchServer("agentic-500", plan=plan) as server:
        trajectories = list(server.context.store.trajectories[:TRAJECTORIES])
        if order_seed is not None:
            random.Random(order_seed).shuffle(trajectories)
        queue: asyncio.Queue[RecordedTrajectory] = asyncio.Queue()
        for trajectory in trajectories:
            queue.put_nowait(trajectory)
        outcomes: dict[str, Any] = {}
        budget = server.context.config.context_length
        inflight = InFlight()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
            async def client() -> None:
                while not queue.empty():
                    trajectory = queue.get_nowait()
                    outcomes[trajectory.id] = await _replay(http, server.url, trajectory, budget, inflight)

            await asyncio.gather(*(client() for _ in range(concurrency)))
        return server.context.faults.log.identities(), outcomes, server.context.faults.never_fired(), inflight.peak


def test_the_same_plan_fires_the_same_events_serially_and_with_256_concurrent_clients() -> None:
    started = time.monotonic()
    serial, serial_outcomes, never, one = asyncio.run(_run(1, None))
    concurrent, concurrent_outcomes, _, peak = asyncio.run(_run(CLIENTS, order_seed=7))
    assert time.monotonic() - started < 60
    assert one == 1 and peak > CLIENTS // 2  # the second run really had requests from most clients in flight
    assert never == []  # every rule fired: the comparison is not vacuous
    assert concurrent == serial
    assert concurrent_outcomes == serial_outcomes  # and every client saw the same answers
    assert len(serial_outcomes) == TRAJECTORIES
    by_fault: dict[str, list[tuple[str, int, int]]] = {}
    for _, fault, trajectory, turn, attempt in serial:
        by_fault.setdefault(fault, []).append((trajectory, turn, attempt))
    # `first=1` on turns 2-3: exactly the first attempt of every turn 2 and 3 that was reached
    reached = sorted((t, turn, 1) for t, seen in serial_outcomes.items() for turn, attempt, _, _ in seen
                     if turn in (2, 3) and attempt == 1)
    assert sorted(by_fault["http_error"]) == reached and reached
    assert all(status == 503 for seen in serial_outcomes.values() for turn, attempt, status, _ in seen
               if turn in (2, 3) and attempt == 1)
    aborted = sorted((t, turn, attempt) for t, seen in serial_outcomes.items() for turn, attempt, _, finish in seen
                     if finish == "abort")
    assert sorted(by_fault["abort"]) == aborted
    requests = sum(len(seen) for seen in serial_outcomes.values())
    assert requests / 40 < len(by_fault["missing_logprobs"]) < requests / 10  # p = 1/20
    assert requests / 100 < len(by_fault["abort"]) < requests / 25  # p = 1/50 (of the requests not 503'd)


# -- (b) statistics ----------------------------------------------------------------------------------------------
def binomial_interval(n: int, p: float, level: float) -> tuple[int, int]:
    """The central `level` interval of Binomial(n, p), from the exact pmf (no normal approximation)."""
    tail = (1 - level) / 2

    def pmf(k: int) -> float:  # in log space: (1 - p) ** n underflows for large n
        return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * math.log(p) + (n - k) * math.log1p(-p))

    cdf, low = 0.0, None
    for k in range(n + 1):
        cdf += pmf(k)
        if low is None and cdf > tail:
            low = k  # P(X < low) <= tail
        if cdf >= 1 - tail:
            return low, k  # type: ignore[return-value]
    raise AssertionError("unreachable: the cdf reaches 1")


def _hits(schedule: Schedule, seed: int, rule: str, targets: list[Target]) -> set[str]:
    return {t.trajectory for t in targets if schedule.fires(seed, rule, t, 0.0)}


def test_binomial_interval_is_right() -> None:
    assert binomial_interval(10, 0.5, 0.9) == (2, 8)  # P(X<=1) = 11/1024 < 0.05 < P(X<=2) = 56/1024
    low, high = binomial_interval(40_000, 1 / 400, 0.999)
    assert 60 < low < 100 < high < 140


def test_one_in_400_fires_within_the_binomial_interval_and_the_seed_decides_which() -> None:
    rule = rule_from_spec("missing_logprobs:p=1/400")
    targets = [Target(f"t{i:05d}", i, f"g{i // 8}", 0, 1, "/generate") for i in range(40_000)]
    low, high = binomial_interval(len(targets), 1 / 400, 0.999)
    hits = {seed: _hits(rule.schedule, seed, rule.name, targets) for seed in (0, 1, 2)}
    for seed, hit in hits.items():
        assert low <= len(hit) <= high, (seed, len(hit), low, high)
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert len(hits[a] & hits[b]) <= 5 < len(hits[a]) // 10  # expected overlap: 100/400 = 0.25
    assert hits[0] == _hits(rule.schedule, 0, rule.name, targets)  # and a rerun hits the same ones
    other = _hits(rule.schedule, 0, "another-rule", targets)
    assert len(other & hits[0]) <= 5  # two rules of one plan are independent


def test_attempts_and_turns_are_drawn_independently() -> None:
    schedule = parse_schedule({"p": "1/2"})
    for field in ("turn", "attempt"):
        targets = [Target("t0", 0, "g0", i if field == "turn" else 0, i if field == "attempt" else 1, "/generate")
                   for i in range(1, 10_001)]
        fired = sum(schedule.fires(5, "r", t, 0.0) for t in targets)
        low, high = binomial_interval(len(targets), 0.5, 0.999)
        assert low <= fired <= high


# -- (c) each schedule key ---------------------------------------------------------------------------------------
def T(trajectory: str = "g00003-1", index: int | None = 25, group: str | None = "g00003", turn: int = 0,
      attempt: int = 1, endpoint: str = "/generate") -> Target:
    return Target(trajectory, index, group, turn, attempt, endpoint)


def fires(spec: str, target: Target, elapsed: float = 0.0, seed: int = 0) -> bool:
    rule = rule_from_spec(spec)
    return rule.schedule.fires(seed, rule.name, target, elapsed)


def test_an_empty_schedule_always_fires() -> None:
    assert all(fires("missing_logprobs", T(turn=turn, attempt=attempt, index=None, group=None))
               for turn in range(5) for attempt in range(1, 5))


def test_every_kth_trajectory() -> None:
    assert [i for i in range(13) if fires("abort:every=3", T(index=i))] == [2, 5, 8, 11]
    assert not fires("abort:every=1", T(index=None))  # a request no trajectory matched has no position
    assert all(fires("abort:every=1", T(index=i)) for i in range(5))


def test_first_n_attempts() -> None:
    assert [a for a in range(1, 7) if fires("http_error:first=2", T(attempt=a))] == [1, 2]
    assert [a for a in range(1, 7) if fires("http_error:first=1", T(attempt=a, turn=4))] == [1]


def test_trajectories_and_groups() -> None:
    spec = "abort:trajectories=g00003-1,g00007-0"
    assert [t for t in ("g00003-1", "g00007-0", "g00003-2", "g00007") if fires(spec, T(trajectory=t))] == [
        "g00003-1", "g00007-0"]
    spec = "abort:groups=g00003,g00009"
    assert [g for g in ("g00003", "g00009", "g00004", None) if fires(spec, T(group=g))] == ["g00003", "g00009"]


def test_turn_and_attempt_ranges() -> None:
    assert [t for t in range(12) if fires("abort:turns=0,2,5-7", T(turn=t))] == [0, 2, 5, 6, 7]
    assert [t for t in range(12) if fires("abort:turns=10", T(turn=t))] == [10]
    assert [a for a in range(1, 8) if fires("abort:attempts=2-3,6", T(attempt=a))] == [2, 3, 6]


def test_endpoints() -> None:
    spec = "abort:endpoints=/generate,/v1/completions"
    assert [e for e in ("/generate", "/v1/completions", "/v1/chat/completions", "/inference/v1/generate")
            if fires(spec, T(endpoint=e))] == ["/generate", "/v1/completions"]


def test_time_window() -> None:
    assert [s for s in (0.0, 4.99, 5.0, 7.5, 9.99, 10.0, 30.0) if fires("outage:window=5-10", T(), s)] == [
        5.0, 7.5, 9.99]
    engine = FaultEngine(dataclasses.replace(plan_from_specs(["outage:window=5-10"], 0), window_from="server_start"))
    engine.server_started = time.monotonic() - 6  # the server has been up 6 s
    assert [r.fault.name for r in engine.decide(T()).rules] == ["outage"]
    engine.server_started = time.monotonic() - 11
    assert engine.decide(T()).rules == ()
    engine.server_started = time.monotonic()
    assert engine.decide(T()).rules == ()


def test_keys_compose_all_must_hold() -> None:
    keys = {"p": "1/2", "turns": "1-2", "attempts": "2-4", "trajectories": "a,b", "groups": "ga",
            "endpoints": "/generate", "window": "0-100", "every": "2", "first": "3"}
    both = parse_schedule(keys)
    alone = {k: parse_schedule({k: v}) for k, v in keys.items()}
    counts = {"all": 0, **{k: 0 for k in keys}}  # targets failing only key k
    for trajectory in ("a", "b", "c"):
        for index in (0, 1, 3, None):
            for group in ("ga", "gb"):
                for turn in range(8):
                    for attempt in (1, 2, 3, 4):
                        for endpoint in ("/generate", "/v1/completions"):
                            for elapsed in (50.0, 150.0):
                                target = Target(trajectory, index, group, turn, attempt, endpoint)
                                each = {k: s.fires(9, "r", target, elapsed) for k, s in alone.items()}
                                assert both.fires(9, "r", target, elapsed) == all(each.values())
                                failing = [k for k, ok in each.items() if not ok]
                                if not failing:
                                    counts["all"] += 1
                                elif len(failing) == 1:
                                    counts[failing[0]] += 1
    assert all(counts.values()), counts  # every key alone was seen to veto a firing


def test_the_engine_puts_forced_rules_first_and_skips_client_side_rules() -> None:
    plan = plan_from_specs(["missing_logprobs:turns=1", "stale_retry", "abort:turns=0", "abort_all_on_weight_update"],
                           3)
    engine = FaultEngine(plan)
    forced = (rule_from_spec("zero_length"),)
    assert [r.name for r in engine.decide(T(turn=0), forced).rules] == ["zero_length#0", "abort#2"]
    assert [r.name for r in engine.decide(T(turn=1)).rules] == ["missing_logprobs#0"]
    assert engine.decide(T(turn=2)).rules == ()


# -- (d) bad specs and plans -------------------------------------------------------------------------------------
VALID_FAULTS = ", ".join(sorted(FAULTS))


@pytest.mark.parametrize("spec, message", [
    ("no_such_fault:p=1/2", f"unknown fault 'no_such_fault'; valid faults: {VALID_FAULTS}"),
    ("http_error:colour=red", "http_error: unknown parameter 'colour'; valid parameters: status, retry_after"),
    ("missing_logprobs:keep=1", "missing_logprobs: unknown parameter 'keep'; valid parameters: none"),
    ("abort:mode=later", "abort: parameter 'mode' must be one of running, queued; got 'later'"),
    ("http_error:status=abc", "http_error: parameter 'status' must be int, got 'abc'"),
    ("http_error:status=302", "http_error: parameter 'status' must be an HTTP error status (400-599); got 302"),
    ("latency:ms=fast", "latency: parameter 'ms' must be float, got 'fast'"),
    ("stream_cut:done=maybe", "stream_cut: parameter 'done' must be bool, got 'maybe'"),
    ("missing_logprobs:p=0", "p: must be in (0, 1]; got '0'"),
    ("missing_logprobs:p=1.5", "p: must be in (0, 1]; got '1.5'"),
    ("missing_logprobs:p=-1/400", "p: must be in (0, 1]; got '-1/400'"),
    ("missing_logprobs:p=often", "p: expected a probability like 0.01 or 1/400; got 'often'"),
    ("missing_logprobs:p=1/0", "p: expected a probability like 0.01 or 1/400; got '1/0'"),
    ("abort:attempts=0", "attempts: attempts count from 1"),
    ("abort:attempts=0-2", "attempts: attempts count from 1"),
    ("abort:every=0", "every: must be a positive integer; got '0'"),
    ("abort:first=0", "first: must be a positive integer; got '0'"),
    ("abort:first=1.5", "first: must be a positive integer; got '1.5'"),
    ("abort:turns=x", "turns: expected integers or ranges like 0,2,5-7; got 'x'"),
    ("abort:turns=-1", "turns: needs one or more non-negative integers; got '-1'"),
    ("abort:turns=7-5", "turns: range '7-5' ends before it starts; got '7-5'"),
    ("outage:window=10-5", "window: needs 0 <= start < end; got '10-5'"),
    ("outage:window=5-5", "window: needs 0 <= start < end; got '5-5'"),
    ("outage:window=5", "window: expected [start, end] seconds or 'start-end'; got '5'"),
    ("abort:mode", "expected key=value after ':', got 'mode'"),
])
def test_bad_specs_are_rejected_with_clear_messages(spec: str, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        rule_from_spec(spec)
    assert str(caught.value) == f"--fault {spec!r}: {message}"
    assert isinstance(caught.value, ValueError)


def test_schedule_errors_name_their_key() -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_schedule({"window": [3, 1]})
    assert caught.value.key == "window"
    with pytest.raises(ScheduleError, match="unknown schedule key; valid: p, every, first, trajectories"):
        parse_schedule({"often": 1})


PLAN = """\
name = "broken"
seed = 4
description = "one bad line per case"

[[rules]]
fault = "missing_logprobs"
p = "1/400"

[[rules]]
name = "second"
{line}
turns = "1-3"
"""


@pytest.mark.parametrize("line, message", [
    ('fault = "no_such_fault"', f"rule 1: unknown fault 'no_such_fault'; valid faults: {VALID_FAULTS}"),
    ('fault = "http_error"\ncolour = "red"', "rule 1: http_error: unknown parameter 'colour'; valid parameters: "
                                             "status, retry_after"),
    ('fault = "http_error"\nstatus = "abc"', "rule 1: http_error: parameter 'status' must be int, got 'abc'"),
    ('fault = "abort"\np = 0', "rule 1: p: must be in (0, 1]; got 0"),
    ('fault = "abort"\nattempts = [0, 1]', "rule 1: attempts: attempts count from 1"),
    ('fault = "outage"\nwindow = [30, 10]', "rule 1: window: needs 0 <= start < end; got [30, 10]"),
])
def test_a_bad_plan_file_names_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "broken.toml"
    text = PLAN.format(line=line)
    path.write_text(text, encoding="utf-8")
    offending = text.splitlines().index(line.splitlines()[-1]) + 1
    assert offending > 9  # in the second rule
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert str(caught.value) == f"{path}:{offending}: {message}"


def test_a_good_plan_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(PLAN.format(line='fault = "http_error"\nstatus = 503\nfirst = 1'), encoding="utf-8")
    plan = load_plan(path)
    assert (plan.name, plan.seed, [r.name for r in plan.rules]) == ("broken", 4, ["missing_logprobs#0", "second"])
    schedule = plan.rules[1].schedule
    assert (set(schedule.turns), schedule.first, plan.rules[1].fault.describe()) == (
        {1, 2, 3}, 1, {"status": 503, "retry_after": 0.0})


@pytest.mark.parametrize("text, inside, outside", [("0-3000000000", [0, 5, 3_000_000_000], [3_000_000_001, -1]),
                                                   ("5-7,1,2,3", [1, 2, 3, 5, 7], [0, 4, 8]),
                                                   ("[9]", [9], [8, 10])])
def test_turn_ranges_cost_their_bounds_not_their_length(text: str, inside: list[int], outside: list[int]) -> None:
    """`turns = "0-3000000"` once built a set of three million (205 MB); ranges are kept as ranges, read back the
    same, and match exactly their members."""
    import tracemalloc

    value = text if text.startswith("[") else f'"{text}"'
    tracemalloc.start()
    plan = parse_plan(f'[[rules]]\nfault = "latency"\nturns = {value}\n', "ranges.toml")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    turns = plan.rules[0].schedule.turns
    assert peak < 2**20 and all(t in turns for t in inside) and not any(t in turns for t in outside)
    again = parse_plan(plan_to_toml(plan), "again.toml")
    assert again.rules[0].describe() == plan.rules[0].describe()


def test_a_turn_past_any_count_is_refused_naming_the_key() -> None:
    with pytest.raises(PlanError, match="turns: 99999999999999999999 is past the largest turn"):
        parse_plan('[[rules]]\nfault = "latency"\nturns = "0-99999999999999999999"\n', "huge.toml")


def test_decisions_for_one_api_are_the_schedules_own_less_the_rules_that_do_not_act_on_it() -> None:
    """`FaultEngine.fired_at(..., api)` (the native fast path's decision) leaves out only the rules whose fault
    `apply` passes by on that API (the chaos plan's `text_without_ids` on `/generate`), and decides the rest as
    `Schedule.fires` does; without `api` it decides every rule."""
    from faults import resolve_plan
    from faults.engine import CompiledPlan

    plan = resolve_plan("chaos")
    compiled = CompiledPlan(plan)
    rng = random.Random(4)
    left_out = 0
    for _ in range(20000):
        target = Target(f"t{rng.randrange(40)}", rng.randrange(40), None, rng.randrange(3), rng.randrange(1, 6),
                        "/generate")
        every = tuple(r for r in plan.rules if r.fault.server_side and not r.fault.on_weight_update
                      and r.schedule.fires(plan.seed, r.name, target, 1.0))
        fields = (target.trajectory, target.index, target.group, target.turn, target.attempt, target.endpoint, 1.0)
        assert compiled.fired_fields(*fields) == every
        for api in ("native", "openai"):
            assert compiled.fired_fields(*fields, api=api) == tuple(r for r in every if api in r.fault.apis)
        left_out += len(every) - len(compiled.fired_fields(*fields, api="native"))
    assert left_out > 0  # text_without_ids fired and was left out for native requests
