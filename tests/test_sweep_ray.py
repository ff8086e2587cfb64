"""`rollout-bench sweep --ray`: a two-node Ray cluster on this machine (Ray's own `cluster_utils`, every node
on 127.0.0.1, small object stores, no dashboard) runs a sweep; one node is removed while a run executes on
it, and every row still arrives exactly once with the same figures as the local executor's for the same
seeds. Skips, saying so, where Ray is not installed (`pip install 'rollout-bench[ray]'`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pytest

from tests.test_sweep import ROOT, _processes_mentioning, sweep

# Ray puts a node on the address of the default route, unless "clusters" are off (its Windows/macOS
# setting), which puts every node and the driver on 127.0.0.1: loopback only. Read when Ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollout-bench[ray]')")

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
GRID = ["--plan", "seed-000", "--target", "ref-gather:fixed", "--rates", "0.1,0.2", "--seeds", "1,2,3", "--n", "20",
        "--time-scale", "0"]
# what a run found: the same for the same seeds whichever executor ran it
FIGURES = ["run", "plan", "target", "rate", "seed", "outcome", "exit_code", "trajectories", "drop_rate", "dropped",
           "n_completed", "n_aborted", "violations", "violated_invariants", "fault_events", "trajectories_hit"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    if ray_constants.ENABLE_RAY_CLUSTER:
        pytest.skip("Ray was imported before this module could keep its nodes on 127.0.0.1")
    # the nodes' workers see no framework environment: a sweep of a real framework must be refused
    saved = os.environ.get("ROLLOUT_BENCH_TARGETS_DIR")
    os.environ["ROLLOUT_BENCH_TARGETS_DIR"] = str(tmp_path_factory.mktemp("no-targets"))
    try:
        built = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        worker = built.add_node(**NODE)
        built.wait_for_nodes()
    finally:
        if saved is None:
            del os.environ["ROLLOUT_BENCH_TARGETS_DIR"]
        else:
            os.environ["ROLLOUT_BENCH_TARGETS_DIR"] = saved
    assert built.address.startswith("127.0.0.1:"), built.address
    yield built, worker
    built.shutdown()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1"}


def test_an_address_where_no_cluster_answers_fails_fast_naming_it(tmp_path: Path) -> None:
    clock = time.monotonic()
    done = sweep(*GRID, "--out", str(tmp_path / "out"), "--ray", "127.0.0.1:1", timeout=120)
    assert done.returncode == 2 and "--ray 127.0.0.1:1: nothing answers there" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - clock < 60 and not (tmp_path / "out").exists()  # ray.init alone retries for minutes


def test_a_node_missing_a_targets_environment_stops_the_sweep_before_any_run(cluster: Any, tmp_path: Path) -> None:
    built, _ = cluster
    done = sweep("--plan", "seed-000", "--target", "verl", "--rates", "0.1", "--seeds", "1", "--out",
                 str(tmp_path / "out"), "--ray", built.address, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    problems = [line for line in done.stderr.splitlines() if "target verl: its environment (verl or verl-0.9)" in line]
    assert len(problems) == 2, done.stderr[-3000:]  # both nodes named, each with its id and address
    assert all("127.0.0.1" in line for line in problems)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda sig: sig.name)
def test_a_dead_ray_driver_leaves_nothing_running_and_resume_runs_only_what_is_missing(
        cluster: Any, tmp_path: Path, sig: signal.Signals) -> None:
    built, _ = cluster
    out = tmp_path / "ray"
    driver = subprocess.Popen([sys.executable, "-m", "bench", "sweep", *GRID, "--out", str(out), "--ray", built.address],
                              cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert driver.stderr is not None
        for line in driver.stderr:
            if "[2/6]" in line:  # two runs finished, two more under way on the two nodes
                driver.send_signal(sig)
                break
        stderr = driver.stderr.read()
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    if sig == signal.SIGTERM:  # stopped as a local sweep is: its tasks cancelled, sweep.json marked
        assert driver.returncode == 128 + sig and "stopped by SIGTERM" in stderr, stderr[-2000:]
        assert "trying again" not in stderr  # a cancelled task is not a lost node
        assert json.loads((out / "sweep.json").read_text())["status"] == "interrupted"
    finished = len((out / "sweep_rows.jsonl").read_text().splitlines())
    assert 2 <= finished < 6
    deadline = time.monotonic() + 60
    while _processes_mentioning("rollout-bench-sweep-"):  # Ray ends a dead driver's tasks, their runs with them
        assert time.monotonic() < deadline, _processes_mentioning("rollout-bench-sweep-")
        time.sleep(0.5)

    resumed = sweep("--resume", str(out), "--ray", built.address, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {out}: {finished} of 6 runs finished, {6 - finished} to run" in resumed.stderr
    ledger = [json.loads(line)["row"]["run"] for line in (out / "sweep_rows.jsonl").read_text().splitlines()]
    assert len(ledger) == 6 and len(set(ledger)) == 6  # only the missing runs ran, each once
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 6 and set(table["outcome"]) == {"ok"}
    assert (table["dropped"] == table["fault_events"]).all()


@pytest.mark.slow
def test_a_node_dying_mid_sweep_loses_no_run_and_changes_no_figure(cluster: Any, tmp_path: Path) -> None:
    built, worker = cluster
    local = sweep(*GRID, "--jobs", "2", "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]

    out = tmp_path / "ray"
    driver = subprocess.Popen([sys.executable, "-m", "bench", "sweep", *GRID, "--out", str(out), "--ray", built.address],
                              cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    doomed = worker.node_id[:8]
    lines, removed_during = [], None
    try:
        assert driver.stderr is not None
        for line in driver.stderr:
            lines.append(line)
            # the worker node's second run has just started (its first finished there): remove the node under it
            if removed_during is None and f"on node {doomed}" in line \
                    and sum(f"on node {doomed}" in seen for seen in lines) == 2:
                removed_during = line.split("sweep: run ", 1)[1].split(":", 1)[0]
                built.remove_node(worker)
        driver.wait(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    stderr = "".join(lines)
    assert driver.returncode == 0, stderr[-3000:]
    assert removed_during is not None, stderr[-3000:]

    table = pd.read_csv(out / "sweep.csv")
    expected = pd.read_csv(tmp_path / "local" / "sweep.csv")
    # every row exactly once, in grid order, with the local executor's figures
    assert list(table["run"]) == list(expected["run"]) and table["run"].is_unique and len(table) == 6
    pd.testing.assert_frame_equal(table[FIGURES], expected[FIGURES])
    pd.testing.assert_frame_equal(pd.read_csv(out / "sweep_faults.csv"),
                                  pd.read_csv(tmp_path / "local" / "sweep_faults.csv"))
    ledger = [json.loads(line)["row"]["run"] for line in (out / "sweep_rows.jsonl").read_text().splitlines()]
    assert sorted(ledger) == sorted(expected["run"])  # finished once each: no duplicate from the retried run
    # placed on both nodes; the run under the removed node was retried on the other and says so
    nodes = {node for cell in table["nodes"] for node in cell.split(";")}
    assert len(nodes) == 2 and doomed in nodes, table[["run", "nodes"]]
    survivor = (nodes - {doomed}).pop()
    retried = table.set_index("run").loc[removed_during]
    assert (retried["attempts"], retried["nodes"]) == (2, f"{doomed};{survivor}"), retried
    assert f"run {removed_during}: attempt 1 lost (node {doomed}" in stderr
    assert set(table.loc[table["run"] != removed_during, "attempts"]) == {1}
    finished_on_doomed = table[(table["nodes"] == doomed)]
    assert len(finished_on_doomed) >= 1  # a run finished on the node before it died
    # each run's report came back whole from its node
    for row in table.itertuples():
        summary = json.loads((out / row.report / "summary.json").read_text())
        assert summary["seed"] == row.seed and (out / row.report / "plan.toml").exists()
        assert (out / row.report / "trajectories.csv").exists() and (out / row.report / "run.log").exists()
    record = json.loads((out / "sweep.json").read_text())
    assert record["status"] == "finished" and record["executor"] == "ray"
    assert set(record["ray"]["nodes"]) == nodes
    assert _processes_mentioning("rollout-bench-sweep-") == []  # the removed node's run did not outlive it


@pytest.mark.slow
def test_a_run_whose_node_dies_on_its_last_attempt_is_a_lost_row_that_resume_runs_again(
        cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The retries are bounded: with one attempt allowed, the run under a removed node is `lost`, named with
    its node and why; `--resume` runs it again (it says nothing about the target)."""
    import threading

    from bench.sweep.grid import parse_plans, parse_rates, parse_seeds
    from bench.sweep.ray_executor import RayExecutor, check_nodes
    from bench.sweep.sweeper import SweepOptions, run_sweep

    built, _ = cluster
    doomed_node = built.add_node(**NODE)
    built.wait_for_nodes()
    doomed = doomed_node.node_id[:8]
    out = tmp_path / "ray"
    ray.init(address=built.address, logging_level="WARNING", log_to_driver=False)
    try:
        executor = RayExecutor(built.address, check_nodes(["ref-gather:fixed"], []), max_attempts=1)
        # a run per CPU, all at once: every node (one CPU each) gets one, the doomed node too
        seeds = ",".join(str(seed) for seed in range(1, executor.cpus + 1))
        grid = (parse_plans("seed-000"), ["ref-gather:fixed"], parse_rates("0.1"), parse_seeds(seeds))
        options = SweepOptions(n=20, time_scale=0, jobs=executor.cpus)
        result: dict[str, Any] = {}
        sweeping = threading.Thread(target=lambda: result.update(rows=run_sweep(*grid, out, options,
                                                                               executor=executor)))
        sweeping.start()
        seen, deadline = "", time.monotonic() + 120
        while f"on node {doomed}" not in seen:
            assert time.monotonic() < deadline and sweeping.is_alive(), seen
            seen += capsys.readouterr().err
            time.sleep(0.05)
        built.remove_node(doomed_node)
        sweeping.join(timeout=300)
        seen += capsys.readouterr().err
        rows = {row["run"]: row for row in result["rows"]}
        [lost] = [row for row in rows.values() if row["nodes"] == doomed]
        assert (lost["outcome"], lost["attempts"]) == ("lost", 1), lost
        assert lost["error"].startswith(f"attempt 1 (node {doomed}): ") and lost["drop_rate"] is None, lost
        assert "trying again" not in seen
        kept = [row for row in rows.values() if row is not lost]
        assert kept and {row["outcome"] for row in kept} == {"ok"}
        assert json.loads((out / "sweep.json").read_text())["outcomes"]["lost"] == 1

        again = run_sweep(*grid, out, options, resume=True, executor=RayExecutor(
            built.address, check_nodes(["ref-gather:fixed"], []), max_attempts=1))
        assert [row["outcome"] for row in again] == ["ok"] * len(rows)
        walls = {row["run"]: row["wall_s"] for row in again}
        assert all(walls[row["run"]] == row["wall_s"] for row in kept)  # kept, not run again
        ledger = [json.loads(line)["row"]["run"] for line in (out / "sweep_rows.jsonl").read_text().splitlines()]
        assert sorted(ledger) == sorted([*rows, lost["run"]])  # the lost run finished once more, nothing else
    finally:
        ray.shutdown()
