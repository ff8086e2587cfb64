"""Plan files fuzzed: any TOML text either loads as a plan or fails with a PlanError or FaultError that names the file
(never another exception, a hang or a huge allocation), and a plan that loads writes back to a TOML that loads to the
same rules. About 1,000 cases on a pull request, 10,000 nightly (ROLLOUT_BENCH_HYPOTHESIS_PROFILE=nightly)."""

from __future__ import annotations

import os
import time
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.testing.hypothesis_profiles import NIGHTLY, PROFILE_ENV, resolve
from faults import FaultError, PlanError
from faults.plan import parse_plan, plan_to_toml, toml_value
from faults.schedule import SCHEDULE_KEYS
from faults.strategies import fault_names

CASES = 10_000 if resolve(os.environ.get(PROFILE_ENV, "")) == NIGHTLY else 1_000
PATH = "fuzzed.toml"
FAULTS = fault_names()  # a strategy over the registered fault types
PARAMETERS = ("seconds", "ms", "status", "keep", "after", "clean", "delta", "mode", "tokens", "extra_tokens",
              "version", "rate", "factor", "message")
SETTINGS = settings(max_examples=CASES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                  HealthCheck.data_too_large])

scalars = st.one_of(st.booleans(), st.integers(-2**64, 2**64), st.floats(), st.text(max_size=16),
                    st.sampled_from(["1/400", "0-3", "0-3000000000", "1/0", "-1", "nan", "inf", "3-1", "0-", "a-b",
                                     "every", "first_request", "server_start", "/generate"]))
ranges = st.builds(lambda low, high: f"{low}-{high}", st.integers(0, 2**40), st.integers(0, 2**40))
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=6), scalars, max_size=3))


@st.composite
def plan_texts(draw: st.DrawFn) -> str:
    """A plan-shaped TOML text: top-level keys, then rules mixing real fault names, schedule keys and parameters."""
    lines = []
    for key in draw(st.lists(st.sampled_from(["name", "seed", "description", "window_from", "bogus"]), max_size=3,
                             unique=True)):
        lines.append(f"{key} = {toml_value(draw(scalars))}")
    for _ in range(draw(st.integers(0, 4))):
        lines.append("[[rules]]")
        if draw(st.booleans()):
            lines.append(f"fault = {toml_value(draw(FAULTS | st.text(max_size=10)))}")
        keys = st.sampled_from(list(SCHEDULE_KEYS) + list(PARAMETERS) + ["name", "fault"]) | st.text(
            st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8)
        for key in draw(st.lists(keys, max_size=4, unique=True)):
            value = draw(ranges | values) if key in ("turns", "attempts") else draw(values)
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def _load(text: str) -> object:
    tracemalloc.start()
    started = time.monotonic()
    try:
        return parse_plan(text, PATH)
    except (PlanError, FaultError) as error:
        assert str(error), "an error without a message"
        return error
    finally:
        took, (_, peak) = time.monotonic() - started, tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert took < 10, f"{took:.1f} s to load:\n{text}"  # tracemalloc slows it several-fold; 20,000 rules: 0.6 s
        assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MB to load:\n{text}"


@SETTINGS
@given(text=plan_texts())
def test_a_plan_shaped_text_loads_or_fails_cleanly_and_round_trips(text: str) -> None:
    loaded = _load(text)
    if isinstance(loaded, Exception):
        return
    again = parse_plan(plan_to_toml(loaded), PATH)  # type: ignore[arg-type]
    assert [r.describe() for r in again.rules] == [r.describe() for r in loaded.rules]  # type: ignore[attr-defined]


@SETTINGS
@given(text=st.text(max_size=400) | st.binary(max_size=400).map(lambda raw: raw.decode("utf-8", "replace")))
def test_any_text_loads_or_fails_cleanly(text: str) -> None:
    _load(text)


@SETTINGS
@given(fault=FAULTS, key=st.sampled_from(SCHEDULE_KEYS), value=ranges | values)
def test_each_schedule_key_takes_any_value_cleanly(fault: str, key: str, value: object) -> None:
    """One valid rule with one drawn schedule value: every key's parser meets every kind of value, huge ranges too."""
    _load(f'[[rules]]\nfault = "{fault}"\n{key} = {toml_value(value)}\n')
