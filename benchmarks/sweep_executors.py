"""`python -m benchmarks.sweep_executors`: what the Ray executor costs per run beside the local one.

The same small sweep (seed-000 against ref-gather:fixed, `--runs` grid points of `--n` trajectories at time
scale 0) runs with the local executor (`--jobs 2`) and with `--ray` on a two-node Ray cluster on this
machine (Ray's `cluster_utils`, 127.0.0.1, one CPU per node: the same two runs at a time), in interleaved
rounds. Per sweep it measures the wall time and the CPU time of everything below this process, sampled
every 0.1 s (`TreeSampler`): the sweep's driver, its runs and their target workers, and for Ray the
cluster's GCS, raylets and workers too. The same method for both executors.
The per-run overhead is (Ray - local) / runs; the fixed cost (joining the cluster, the node check) is
the time until the sweep's first run starts. It then extrapolates a 1,000-run nightly sweep on N nodes
from these figures: an extrapolation from one machine, not a measurement on N nodes.
Needs Ray (`pip install 'rollout-bench[ray]'`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bench.isolation.proc_stat import read_stat

from .common import DEFAULT_OUT, interleaved, machine, median, print_table, process_tree, write_results

ROOT = Path(__file__).resolve().parent.parent
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def _tree_cpu() -> dict[tuple[int, int], float]:
    """User + system CPU seconds of every process below this one, by (pid, start time): the cluster's
    daemons and workers, a sweep's driver, its runs and their target workers."""
    found = {}
    for pid in process_tree(os.getpid())[1:]:
        stat = read_stat(pid)
        if stat is not None:  # else ended meanwhile
            found[(pid, stat.start_ticks)] = stat.cpu_s
    return found


class TreeSampler:
    """The CPU used below this process while it runs, sampled every `interval_s` (a process that ends is
    counted up to its last sample: at most `interval_s` of it is missed). The same for both executors."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s, self.start, self.last = interval_s, _tree_cpu(), {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.last.update(_tree_cpu())

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.last.update(_tree_cpu())

    def used_s(self) -> float:
        return sum(cpu - self.start.get(key, 0.0) for key, cpu in self.last.items())


def run_sweep(kind: str, address: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    seeds = ",".join(str(seed) for seed in range(1, args.runs + 1))
    command = [sys.executable, "-m", "bench", "sweep", "--plan", "seed-000", "--target", "ref-gather:fixed",
               "--rates", "0.1", "--seeds", seeds, "--n", str(args.n), "--time-scale", "0", "--jobs", "2",
               "--out", str(out)] + (["--ray", address] if kind == "ray" else [])
    with TreeSampler() as sampler:
        clock = time.monotonic()
        driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        first_run_s = None
        assert driver.stderr is not None
        for line in driver.stderr:
            if first_run_s is None and line.startswith("sweep: run "):
                first_run_s = time.monotonic() - clock
        _, status, usage = os.wait4(driver.pid, 0)
        wall = time.monotonic() - clock
    driver.returncode = os.waitstatus_to_exitcode(status)
    if driver.returncode != 0:
        raise SystemExit(f"the {kind} sweep failed (exit {driver.returncode}); see {out}")
    # the driver as the kernel counted it (itself and what it reaped: for the local executor, its runs)
    driver_cpu = usage.ru_utime + usage.ru_stime
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == args.runs and set(table["outcome"]) == {"ok"}, table
    return {"kind": kind, "wall_s": wall, "cpu_s": sampler.used_s(), "driver_cpu_s": driver_cpu,
            "first_run_s": first_run_s or float("nan"), "run_wall_s": float(table["wall_s"].mean()),
            "figures": table[["run", "outcome", "dropped", "fault_events"]].to_dict("records")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6, help="grid points per sweep (default 6)")
    parser.add_argument("--n", type=int, default=20, help="trajectories per run (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per executor (default 2)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="2 runs of 4 trajectories, 1 round (the test suite's)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.n, args.rounds = 2, 4, 1
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every node on 127.0.0.1
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        raise SystemExit("needs Ray: pip install 'rollout-bench[ray]'") from None
    info = machine()
    print(f"machine: {info['cores']} cores ({info['cpu']}), Python {info['python']}, {info['date']}, "
          f"load average {os.getloadavg()[0]:.2f}")
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sweep-executors-") as scratch:
            for round_index, kind in interleaved(["local", "ray"], args.rounds):
                result = run_sweep(kind, cluster.address, args, Path(scratch) / f"{kind}-{round_index}")
                result["load_average"] = os.getloadavg()[0]
                results.append(result)
                print(f"round {round_index} {kind}: {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} s CPU, "
                      f"load average {result['load_average']:.2f}", flush=True)
    finally:
        cluster.shutdown()
    by_kind = {kind: [r for r in results if r["kind"] == kind] for kind in ("local", "ray")}
    assert by_kind["local"][0]["figures"] == by_kind["ray"][0]["figures"], "the executors disagree on a run"
    # per run: from the first run's start to the end (the fixed cost before it is reported apart), over the runs
    per_run = {kind: {"wall_s": median([(r["wall_s"] - r["first_run_s"]) / args.runs for r in rows]),
                      "cpu_s": median([r["cpu_s"] / args.runs for r in rows]),
                      "first_run_s": median([r["first_run_s"] for r in rows]),
                      "run_wall_s": median([r["run_wall_s"] for r in rows])}
               for kind, rows in by_kind.items()}
    rows = [[kind, values["wall_s"], values["cpu_s"], values["run_wall_s"], values["first_run_s"]]
            for kind, values in per_run.items()]
    print_table(["executor", "wall s per run (2 at once)", "CPU s per run", "a run's own wall s",
                 "start to first run s"], rows)
    cpu_ratio = per_run["ray"]["cpu_s"] / per_run["local"]["cpu_s"]
    wall_ratio = per_run["ray"]["wall_s"] / per_run["local"]["wall_s"]
    overhead_wall = (per_run["ray"]["wall_s"] - per_run["local"]["wall_s"]) * 2  # per run, on the CPU it holds
    overhead_cpu = per_run["ray"]["cpu_s"] - per_run["local"]["cpu_s"]  # with the cluster's daemons meanwhile
    fixed = per_run["ray"]["first_run_s"] - per_run["local"]["first_run_s"]
    print(f"Ray / local: CPU per run x{cpu_ratio:.2f}, wall per run x{wall_ratio:.2f}; Ray's overhead per run "
          f"{overhead_wall:+.2f} s wall on its CPU, {overhead_cpu:+.2f} s CPU; fixed cost {fixed:+.1f} s "
          f"(join + node check); load average {os.getloadavg()[0]:.2f}")
    extrapolated = []
    for run_s in (10.0, 60.0, 120.0):
        for nodes, cpus in ((1, 8), (4, 8), (16, 8)):
            hours = (per_run["ray"]["first_run_s"] + 1000 * (run_s + max(overhead_wall, 0.0)) / (nodes * cpus)) / 3600
            extrapolated.append({"run_s": run_s, "nodes": nodes, "cpus_per_node": cpus, "hours": round(hours, 2)})
    print("1,000 runs, EXTRAPOLATED from the figures above (not measured on N nodes):")
    print_table(["a run's own s", "nodes", "CPUs each", "hours"],
                [[e["run_s"], e["nodes"], e["cpus_per_node"], e["hours"]] for e in extrapolated])
    payload = {"machine": info, "parameters": vars(args) | {"out": str(args.out)}, "rounds": results,
               "per_run": per_run, "cpu_ratio": cpu_ratio, "wall_ratio": wall_ratio,
               "overhead_wall_s_per_run": overhead_wall, "overhead_cpu_s_per_run": overhead_cpu,
               "fixed_s": fixed, "extrapolated_1000_runs": extrapolated}
    json_path, _ = write_results(args.out, "sweep_executors",
                                 payload, [{k: v for k, v in r.items() if k != "figures"} for r in results])
    print(f"results: {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
