"""Hypothesis strategies (fault rules, plans, tokenizer-consistent traces) and the shrinking helper.

Search tests run reference targets inline on small traces (or the first 40 trajectories of
agentic-500) with time scale 0, so each example is a fraction of a second.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import RunConfig, run
from bench.testing.explore import check_plan, explore, plan_to_toml, prefix_trace, shrink_plan
from bench.testing.strategies import consistent_header, consistent_trajectories, traces
from bench.tokenizer import load_tokenizer
from bench.trace import validate_trace
from bench.trace.checks import check_tokenization, check_trajectory
from faults import FAULTS, load_plan, make_rule, resolve_plan
from faults.plan import parse_plan
from faults.strategies import fault_names, faults, plans, rules, sub_plans

CRASHING = {"http_error", "router_no_workers", "malformed_json", "raise_after_generate", "outage",
            "connection_reset", "truncated_body"}  # faults that make ref-gather:unfixed's bare gather raise


# --- fault strategies -------------------------------------------------------------------------

@given(plans(max_rules=5, trajectories=["g00000-0", "g00001-2"], groups=["g00001"], windows=True))
def test_drawn_plans_round_trip_through_a_plan_file(plan) -> None:
    names = [rule.name for rule in plan.rules]
    assert len(set(names)) == len(names) and 1 <= len(plan.rules) <= 5
    again = parse_plan(plan_to_toml(plan), "<drawn>")
    assert again.rules == plan.rules and again.seed == plan.seed


@given(faults())
def test_drawn_faults_pass_their_own_checks(fault) -> None:
    fault.check()
    assert type(fault).from_params(fault.describe()) == fault


def test_fault_names_cover_the_catalogue_and_filter() -> None:
    seen: set[str] = set()

    @settings(max_examples=300, derandomize=True)
    @given(fault_names())
    def collect(name: str) -> None:
        seen.add(name)

    collect()
    assert seen == set(FAULTS)
    with pytest.raises(ValueError, match="no fault type matches"):
        fault_names(categories=["nope"])


@given(fault_names(server_side=False), fault_names(categories=["http"], api="openai"))
def test_fault_names_filter(client_side: str, http: str) -> None:
    assert not FAULTS[client_side].server_side
    assert FAULTS[http].category == "http" and "openai" in FAULTS[http].apis


@given(st.data())
def test_sub_plans_keep_order_seed_and_only_candidates(data: st.DataObject) -> None:
    chaos = resolve_plan("chaos")
    candidates = [r.name for r in chaos.rules[::3]]
    sub = data.draw(sub_plans(chaos, candidates=candidates))
    assert sub.seed == chaos.seed and 1 <= len(sub.rules)
    assert {r.name for r in sub.rules} <= set(candidates)
    positions = [chaos.rules.index(r) for r in sub.rules]
    assert positions == sorted(positions)


@given(rules(trajectories=["g00000-0"]))
def test_drawn_rules_rebuild_from_their_flat_values(rule) -> None:
    values = {"fault": rule.fault.name, "name": rule.name, **rule.fault.describe(), **rule.schedule.describe()}
    assert make_rule(values, "x") == rule


# --- trace strategies -------------------------------------------------------------------------

@given(consistent_trajectories(max_turns=4))
def test_consistent_trajectories_pass_format_and_tokenizer_checks(trajectory) -> None:
    assert list(check_trajectory(trajectory, consistent_header())) == []
    assert list(check_tokenization(trajectory, load_tokenizer())) == []


@settings(max_examples=4, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(traces(max_groups=2, max_group_size=3, max_turns=3))
def test_drawn_traces_replay_to_a_multi_turn_target_without_drift(tmp_path_factory: pytest.TempPathFactory,
                                                                    drawn) -> None:
    path = drawn.write(tmp_path_factory.mktemp("drawn") / "drawn.jsonl")
    assert list(validate_trace(path)) == []
    result = asyncio.run(run(RunConfig(trace=str(path), target="ref-tool-loop:fixed", isolation="inline",
                                       target_options={"trace": str(path)})))
    assert result.violations == [], [v.message for v in result.violations]
    generate = [r for r in result.requests if r.endpoint == "/generate"]
    assert [r.drift for r in generate if r.drift] == []
    assert len(generate) == sum(len(t.turns) for t in drawn.trajectories)  # every recorded turn, nothing else


# --- the shrinking helper ---------------------------------------------------------------------

def test_shrinking_the_chaos_plan_leaves_one_rule_that_still_crashes_the_gather(tmp_path: Path) -> None:
    chaos = resolve_plan("chaos")
    found = shrink_plan("ref-gather:unfixed", chaos, n=40, watchdog_s=10)
    print(f"chaos seed {chaos.seed}: {len(found.candidates)} rules fired ({', '.join(found.candidates)}); "
          f"minimal: {[r.name for r in found.plan.rules]} after {found.runs} runs")
    assert len(chaos.rules) > 20 and len(found.candidates) >= 2  # there was something to shrink
    (rule,) = found.plan.rules
    assert rule in chaos.rules and rule.name in found.candidates and rule.fault.name in CRASHING
    assert found.invariants == {"batch_survival"} and found.confirmed is True
    assert found.result.batch_error is not None and "batch_survival" in {v.invariant for v in found.result.violations}
    assert {e.rule for e in found.result.fault_events} == {rule.name}
    # The written plan file reproduces it on its own, in a fresh run.
    again = load_plan(found.write(tmp_path / "minimal.toml"))
    assert again.rules == found.plan.rules and again.seed == chaos.seed
    rerun = asyncio.run(run(RunConfig(plan=again, target="ref-gather:unfixed", n=40, isolation="inline")))
    assert "batch_survival" in {v.invariant for v in rerun.violations}


SHRINK_PLAN = """
name = "mixed"
seed = 3

[[rules]]
name = "slow"
fault = "latency"
ms = 1

[[rules]]
name = "noise"
fault = "missing_logprobs"
trajectories = "g00000-1"

[[rules]]
name = "crash"
fault = "http_error"
status = 500
trajectories = "g00001-2"
turns = "0"

[[rules]]
name = "more-noise"
fault = "logprob_length_mismatch"
trajectories = "g00000-3"
"""


@pytest.mark.parametrize("target, invariant, expected", [
    ("ref-gather:unfixed", "batch_survival", "crash"),
    ("ref-gather:fixed", "token_alignment", "noise"),
])
def test_shrinking_finds_the_one_rule_behind_the_named_invariant(small_agentic: Path, target: str, invariant: str,
                                                                 expected: str) -> None:
    plan = parse_plan(SHRINK_PLAN, "<test>")
    found = shrink_plan(target, plan, trace=str(small_agentic), invariants=[invariant])
    assert [r.name for r in found.plan.rules] == [expected]
    assert invariant in {v.invariant for v in found.violations} and found.confirmed is None
    assert expected in found.candidates and len(found.candidates) >= 2


def test_shrinking_a_plan_that_does_not_fail_is_an_error(small_agentic: Path) -> None:
    with pytest.raises(ValueError, match="does not make ref-gather:fixed violate any invariant"):
        shrink_plan("ref-gather:fixed", resolve_plan("seed-000"), trace=str(small_agentic))


def test_explore_finds_and_shrinks_a_crashing_plan(small_agentic: Path) -> None:
    http = plans(max_rules=3, names=fault_names(categories=["http"]), trajectories=["g00000-0", "g00001-2"])
    found = explore("ref-gather:unfixed", http, trace=str(small_agentic), invariants=["batch_survival"],
                    settings=settings(max_examples=30, derandomize=True, database=None, deadline=None))
    assert found is not None
    (rule,) = found.plan.rules
    assert rule.fault.name in CRASHING and found.violations
    assert found.result.fault_events and {e.rule for e in found.result.fault_events} == {rule.name}


def test_explore_returns_none_when_nothing_fails(small_agentic: Path) -> None:
    harmless = plans(max_rules=2, names=st.just("latency"), max_delay_s=0.01)
    assert explore("ref-gather:fixed", harmless, trace=str(small_agentic),
                   settings=settings(max_examples=3, derandomize=True, database=None, deadline=None)) is None


def test_check_plan_names_the_plan_in_its_failure(small_agentic: Path) -> None:
    plan = parse_plan(SHRINK_PLAN, "<test>")
    with pytest.raises(AssertionError, match=r"(?s)violates batch_survival.*name = \"crash\".*g00001-2"):
        check_plan("ref-gather:unfixed", plan, trace=str(small_agentic), invariants=["batch_survival"])
    assert check_plan("ref-gather:fixed", plan, trace=str(small_agentic), invariants=["batch_survival"]).records


def test_prefix_trace_keeps_the_header_and_the_first_trajectories(tmp_path: Path) -> None:
    short = prefix_trace("agentic-500", 6, tmp_path)
    lines = short.read_bytes().splitlines()
    assert len(lines) == 7 and lines[0].startswith(b'{"type":"header"') and b'"id":"g00001-1"' in lines[6]
    assert list(validate_trace(short)) == []
    with pytest.raises(ValueError, match="at least 1"):
        prefix_trace("agentic-500", 0, tmp_path)
