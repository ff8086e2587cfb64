"""Shipped plans load, and every rule in them fires on the shipped traces."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bench.replay import TraceStore
from bench.server import BenchServer
from faults import PlanError, Target, load_plan, resolve_plan, shipped_plans
from tests.server_helpers import turn_input

PLANS = ["chaos", "seed-000", "seed-001", "seed-002", "seed-003", "seed-004"]


@pytest.fixture(scope="module")
def agentic() -> TraceStore:
    return TraceStore.load(Path(__file__).parent.parent / "traces" / "agentic-500.jsonl.gz")


def test_the_shipped_plans_are_there() -> None:
    assert sorted(shipped_plans()) == PLANS
    for name in PLANS:
        plan = resolve_plan(name)
        assert plan.name == name and plan.rules and plan.description


@pytest.mark.parametrize("name", PLANS)
def test_every_rule_fires_on_the_agentic_trace(agentic: TraceStore, name: str) -> None:
    plan = resolve_plan(name)
    for rule in plan.rules:
        if rule.fault.on_weight_update:
            continue  # acts on weight updates, not requests (tested with the server)
        fired = sum(rule.schedule.fires(plan.seed, rule.name, Target(t.id, t.index, t.group_id, turn, 1, "/generate"),
                                        0.0)
                    for t in agentic.trajectories for turn in range(len(t.turns)))
        assert fired >= 1, f"{name}: rule {rule.name} never fires on agentic-500"


def test_seed_000_poisons_one_trajectory_in_a_500_rollout() -> None:
    """Through the real server: turn 0 of every trajectory, one poisoned reply, as in slime#2078."""

    async def run() -> list[str]:
        async with BenchServer("agentic-500", plan="seed-000") as server:
            store = server.context.store
            async with aiohttp.ClientSession() as http:
                async def send(trajectory) -> None:  # type: ignore[no-untyped-def]
                    async with http.post(f"{server.url}/generate", json={"input_ids": turn_input(trajectory, 0)},
                                         headers={"X-Bench-Trajectory": trajectory.id}) as reply:
                        assert reply.status == 200
                await asyncio.gather(*(send(t) for t in store.trajectories))
            assert server.context.faults.never_fired() == []
            return [e.trajectory for e in server.context.faults.log.events]

    assert asyncio.run(run()) == ["g00120-3"]


def test_plan_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\nseed = 1\n\n[[rules]]\nfault = "http_error"\nstatus = 200\n', encoding="utf-8")
    with pytest.raises(PlanError, match=rf"{path}:6: rule 0: http_error: parameter 'status' must be an HTTP error"):
        load_plan(path)
    path.write_text('seed = 1\n[[rules]]\nfault = "missing_logprobs"\n[[rules]]\nfault = "nope"\n', encoding="utf-8")
    with pytest.raises(PlanError, match=rf"{path}:5: rule 1: unknown fault 'nope'; valid faults: abort, "):
        load_plan(path)
    path.write_text('seed = 1\n[[rules]]\nfault = "abort"\nturns = "x"\n', encoding="utf-8")
    with pytest.raises(PlanError, match=rf"{path}:4: rule 0: turns: expected integers"):
        load_plan(path)
    path.write_text('seed = 1\n[[rules]\n', encoding="utf-8")
    with pytest.raises(PlanError, match=rf"{path}:2: not valid TOML"):
        load_plan(path)
    with pytest.raises(PlanError, match="not a shipped plan"):
        resolve_plan("no-such-plan")
