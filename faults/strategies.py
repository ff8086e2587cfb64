"""Hypothesis strategies for fault rules and plans (needs hypothesis: the `test` extra).

Every drawn rule is valid by construction: it is built by `make_rule` from the same flat
values a plan file holds, and its parameters pass the fault's own `check`. Property tests
spend their examples on the code under test instead of on rejected input, and a drawn plan
can be written to TOML and loaded back unchanged. `sub_plans(plan)` draws subsets of a
plan's rules, which is what `bench.testing.explore` shrinks when it looks for the smallest plan
that still breaks a target.
"""

from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st

from .base import FAULTS, fault_class
from .plan import Plan, Rule, make_rule

ENDPOINTS = ("/generate", "/v1/chat/completions", "/v1/completions")
ROUTER_VERSIONS = ("0.3.2", "0.2")


def _rounded(low: float, high: float) -> st.SearchStrategy[float]:
    """Floats in [low, high] with three decimals: readable in a plan file, exact in TOML."""
    return st.floats(low, high, allow_nan=False, allow_infinity=False).map(lambda x: min(high, round(x, 3)))


def parameter_strategies(max_delay_s: float = 1.0) -> dict[str, dict[str, st.SearchStrategy[Any]]]:
    """Values worth trying per fault type and parameter; parameters not listed keep their default.

    Delays stay at or under `max_delay_s` so that a drawn plan cannot turn a run into a wait.
    """
    delay = _rounded(0.0, max_delay_s)
    return {
        "abort": {"mode": st.sampled_from(["running", "queued"]), "keep": _rounded(0.0, 1.0)},
        "context_length_error": {"context_length": st.just(0) | st.integers(1, 8192)},
        "http_error": {"status": st.sampled_from([400, 404, 429, 500, 502, 503, 504]),
                       "retry_after": st.sampled_from([0.0, 0.5, 1.0])},
        "latency": {"ms": _rounded(0.0, max_delay_s * 1000), "jitter_ms": _rounded(0.0, 50.0),
                    "distribution": st.sampled_from(["fixed", "lognormal"]), "sigma": _rounded(0.1, 2.0)},
        "logprob_length_mismatch": {"delta": st.integers(-3, 3).filter(bool)},
        "nan_logprob": {"position": st.integers(0, 16)},
        "null_logprob": {"position": st.integers(0, 16)},
        "outage": {"status": st.sampled_from([503, 500, 502]), "router_version": st.sampled_from(ROUTER_VERSIONS)},
        "oversized_tool_output": {"bytes": st.integers(1, 200_000)},
        "router_no_workers": {"router_version": st.sampled_from(ROUTER_VERSIONS)},
        "slow_first_token": {"seconds": delay},
        "stale_retry": {"keep_tokens": st.booleans()},
        "stale_weight_version": {"behind": st.integers(1, 3)},
        "stall": {"seconds": delay},
        "stream_cut": {"after": st.integers(0, 4), "done": st.booleans(), "clean": st.booleans()},
        "truncated_body": {"keep": _rounded(0.0, 0.99)},
        "wrong_content_type": {"content_type": st.sampled_from(["application/octet-stream", "text/plain",
                                                                "text/html"])},
    }


def fault_names(*, categories: Sequence[str] | None = None, server_side: bool | None = None,
                api: str | None = None) -> st.SearchStrategy[str]:
    """Names of registered fault types, optionally only some categories, sides or one API."""
    fault_class("abort")  # registers the catalogue
    names = sorted(
        name for name, cls in FAULTS.items()
        if (categories is None or cls.category in categories)
        and (server_side is None or cls.server_side == server_side)
        and (api is None or api in cls.apis)
    )
    if not names:
        raise ValueError(f"no fault type matches categories={categories!r} server_side={server_side!r} api={api!r}")
    return st.sampled_from(names)


@st.composite
def fault_params(draw: st.DrawFn, name: str, max_delay_s: float = 1.0) -> dict[str, Any]:
    """Parameters for fault type `name`, as a plan file writes them (only the ones drawn)."""
    fault_class(name)  # a clear error for an unknown name
    table = parameter_strategies(max_delay_s).get(name, {})
    return {key: draw(strategy) for key, strategy in table.items() if draw(st.booleans())}


def faults(names: st.SearchStrategy[str] | None = None, max_delay_s: float = 1.0) -> st.SearchStrategy[Any]:
    """`Fault` instances with valid parameters."""
    return (names if names is not None else fault_names()).flatmap(
        lambda name: fault_params(name, max_delay_s).map(lambda params: fault_class(name).from_params(params)))


@st.composite
def schedule_values(draw: st.DrawFn, *, trajectories: Sequence[str] | None = None,
                    groups: Sequence[str] | None = None, max_turn: int = 8, windows: bool = False) -> dict[str, Any]:
    """Flat schedule keys as a plan file writes them; each key is present or not.

    `window` (wall-clock time) is off by default: it is the one key that depends on timing.
    Trajectory and group filters need the ids to choose from.
    """
    values: dict[str, Any] = {}
    if draw(st.booleans()):
        values["p"] = f"1/{draw(st.integers(1, 1000))}"
    if draw(st.booleans()):
        values["turns"] = sorted(draw(st.sets(st.integers(0, max_turn), min_size=1, max_size=3)))
    if draw(st.booleans()):
        values["attempts"] = sorted(draw(st.sets(st.integers(1, 4), min_size=1, max_size=2)))
    if draw(st.booleans()):
        values["first"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        values["every"] = draw(st.integers(1, 10))
    if trajectories and draw(st.booleans()):
        values["trajectories"] = sorted(draw(st.sets(st.sampled_from(list(trajectories)), min_size=1, max_size=3)))
    if groups and draw(st.booleans()):
        values["groups"] = sorted(draw(st.sets(st.sampled_from(list(groups)), min_size=1, max_size=2)))
    if draw(st.booleans()):
        values["endpoints"] = sorted(draw(st.sets(st.sampled_from(ENDPOINTS), min_size=1)))
    if windows and draw(st.booleans()):
        start = draw(_rounded(0.0, 30.0))
        values["window"] = [start, round(start + draw(_rounded(0.1, 30.0)), 3)]
    return values


@st.composite
def rule_values(draw: st.DrawFn, *, names: st.SearchStrategy[str] | None = None, max_delay_s: float = 1.0,
                **schedule: Any) -> dict[str, Any]:
    """One rule as flat values (`fault`, parameters, schedule keys): what `make_rule` and TOML take."""
    name = draw(names if names is not None else fault_names())
    return {"fault": name, **draw(fault_params(name, max_delay_s)), **draw(schedule_values(**schedule))}


def rules(*, names: st.SearchStrategy[str] | None = None, max_delay_s: float = 1.0,
          **schedule: Any) -> st.SearchStrategy[Rule]:
    """Valid fault rules (schedule options as in `schedule_values`)."""
    return rule_values(names=names, max_delay_s=max_delay_s, **schedule).map(
        lambda values: make_rule(values, f"{values['fault']}#0"))


@st.composite
def plans(draw: st.DrawFn, *, min_rules: int = 1, max_rules: int = 4, seeds: st.SearchStrategy[int] | None = None,
          names: st.SearchStrategy[str] | None = None, max_delay_s: float = 1.0, **schedule: Any) -> Plan:
    """Plans of a few valid rules with unique names (`<fault>#<index>`) and a drawn seed."""
    seed = draw(seeds if seeds is not None else st.integers(0, 2**31 - 1))
    values = draw(st.lists(rule_values(names=names, max_delay_s=max_delay_s, **schedule), min_size=min_rules,
                           max_size=max_rules))
    drawn = tuple(make_rule(v, f"{v['fault']}#{i}") for i, v in enumerate(values))
    return Plan("drawn", seed, drawn, "drawn by faults.strategies.plans")


def sub_plans(plan: Plan, *, min_rules: int = 1, candidates: Sequence[str] | None = None) -> st.SearchStrategy[Plan]:
    """Plans made of some of `plan`'s rules (in the plan's order), seed and name kept.

    One independent "keep this rule?" flag per rule: Hypothesis shrinks each flag toward
    "drop", so a failing sub-plan shrinks to one where no single rule can be dropped. (A
    unique list drawn from the rules shrinks badly: dropping its first element changes what
    the later draws mean.) `candidates` (rule names) limits the draw to those rules, e.g.
    the ones that fired in a failing run.
    """
    pool = [rule for rule in plan.rules if candidates is None or rule.name in candidates]
    if len(pool) < min_rules:
        raise ValueError(f"plan {plan.name!r}: {len(pool)} candidate rules, fewer than min_rules={min_rules}")
    flags = st.lists(st.booleans(), min_size=len(pool), max_size=len(pool)).filter(lambda f: sum(f) >= min_rules)
    return flags.map(lambda keep: Plan(plan.name, plan.seed, tuple(r for r, k in zip(pool, keep) if k),
                                       plan.description, plan.source, plan.window_from))


__all__ = ["ENDPOINTS", "fault_names", "fault_params", "faults", "parameter_strategies", "plans", "rule_values",
           "rules", "schedule_values", "sub_plans"]
