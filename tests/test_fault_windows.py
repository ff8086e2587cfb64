"""Fault windows count from the target's first request, not from the server's start.

The observed case: a framework that starts Ray (30 s) inside its rollout let an outage window
elapse before it sent anything, and the plan never touched it. A plan may still ask for the
server's start (`window_from = "server_start"`).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench import RunConfig, RunResult, run_blocking
from bench.server import ServerThread
from faults import Plan, PlanError, load_plan
from faults.plan import parse_plan, plan_to_toml
from tests.server_helpers import request, turn_input

SLOW_START = "tests.slow_start_target:SlowStart"
SLEEP_S = 1.0  # inside run(), before the first request
WINDOW_S = 0.5  # the outage: the first half of that


def _outage(window_from: str | None = None) -> Plan:
    text = ('name = "early-outage"\nseed = 1\n' + (f'window_from = "{window_from}"\n' if window_from else "")
            + f'\n[[rules]]\nname = "outage"\nfault = "outage"\nwindow = [0.0, {WINDOW_S}]\n')
    return parse_plan(text, "<test>")


def _run(plan: Plan) -> RunResult:
    return run_blocking(RunConfig(trace="rlvr-500", plan=plan, target=SLOW_START, n=3, isolation="inline",
                                  target_options={"sleep_s": SLEEP_S}))


def test_an_outage_window_counts_from_the_targets_first_request() -> None:
    before = time.time()
    result = _run(_outage())
    first = next(r for r in result.requests if r.attempt is not None)
    assert first.status == 503  # the router's no-available-workers answer
    event = result.fault_events[0]
    assert (event.fault, event.trajectory, event.turn, event.attempt) == ("outage", first.trajectory, 0, 1)
    assert before + SLEEP_S <= event.time <= time.time()  # events keep unix time
    assert "vacuity" not in {v.invariant for v in result.violations}


def test_a_plan_may_count_windows_from_the_server_start() -> None:
    result = _run(_outage("server_start"))
    assert result.fault_events == []
    assert all(r.status == 200 for r in result.requests if r.attempt is not None)
    [vacuity] = [v.message for v in result.violations if v.invariant == "vacuity"]
    assert vacuity.startswith("rule 'outage' (outage) never fired")


def test_serve_counts_from_the_first_request_and_a_swapped_plan_from_its_own() -> None:
    with ServerThread("rlvr-500", plan=_outage()) as server:
        body = {"input_ids": turn_input(server.context.store.trajectories[0], 0), "return_logprob": True}
        time.sleep(SLEEP_S)  # the training stack pointed at `serve` takes its time to start
        assert request(server.url, "/generate", body).status == 503
        time.sleep(WINDOW_S + 0.1)
        assert request(server.url, "/generate", body).status == 200  # past the window
        assert request(server.url, "/bench/plan").json()["window_from"] == "first_request"
        swapped = request(server.url, "/bench/plan", {"toml": plan_to_toml(_outage())}, method="PUT")
        assert swapped.status == 200
        time.sleep(WINDOW_S + 0.1)
        assert request(server.url, "/generate", body).status == 503  # the new plan's first request


def test_window_from_is_read_written_and_checked(tmp_path: Path) -> None:
    assert _outage().window_from == "first_request"
    kept = _outage("server_start")
    assert kept.window_from == "server_start" and kept.with_seed(9).window_from == "server_start"
    assert kept.scaled(0.5).window_from == "server_start"
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(kept))
    assert load_plan(path).window_from == "server_start"
    assert "window_from" not in plan_to_toml(_outage())  # the default is not written
    path.write_text('name = "bad"\nseed = 1\nwindow_from = "target_start"\n')
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert str(caught.value) == (f"{path}:3: window_from must be one of 'first_request', 'server_start'; "
                                 "got 'target_start'")
