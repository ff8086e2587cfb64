"""`python -m benchmarks.repro_warm`: wall time of `rollout-bench run --repro R`, cold vs. forked from a warm worker.

The README's claim (Runs, "Warm workers"): a repro of the seed-000 crash on real miles takes ~11-12 s cold,
most of it the worker importing miles, and ~3 s forked from a warm worker. This measures both in one run:
it makes the repro file (the seed-000 plan on one trajectory, through the Python API), starts a warm worker
(`rollout-bench worker --target T --detach`), then times `rollout-bench run --repro R --cold` and
`rollout-bench run --repro R` in interleaved rounds, checking each run went the way it claims
(`summary.json`'s `worker.forked_from_warm`) and reproduced the violation. Target: miles when its
environment is built (`make targets`), else the light `ref-gather` reference target.

Warm workers are found by their socket folder: this uses a private one (ROLLOUT_BENCH_RUNTIME_DIR under
/tmp), so it never forks from, or stops, a warm worker a developer left running, and it stops its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.isolation.proc_stat import read_stat

from .common import DEFAULT_OUT, machine, median, print_table, write_results

CLI = [sys.executable, "-m", "bench"]


def make_repro(target: str, trace: str, plan: str, trajectory: str, path: Path) -> tuple[Path, float]:
    """Run the plan on one trajectory (cold) and write its repro; (repro path, that run's wall seconds)."""
    from bench import RunConfig, run
    from bench.orchestration.repro import write_repro
    from faults import resolve_plan

    clock = time.monotonic()
    result = asyncio.run(run(RunConfig(trace=trace, plan=resolve_plan(plan), target=target, trajectories=[trajectory],
                                       watchdog_s=120.0, warm=False)))
    took = time.monotonic() - clock
    repro = write_repro(result, path)
    if repro is None:
        raise SystemExit(f"{target} under {plan} on {trajectory} ({trace}) violated nothing: no repro to time")
    return repro, took


def timed_run(repro: Path, out: Path, cold: bool) -> dict[str, Any]:
    """`rollout-bench run --repro` as a user types it; its wall time and what its summary says."""
    command = [*CLI, "run", "--repro", str(repro), "--out", str(out), *(["--cold"] if cold else [])]
    clock = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - clock
    summary_path = out / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"`{' '.join(command)}` wrote no summary (exit {done.returncode}):\n{done.stdout[-3000:]}")
    summary = json.loads(summary_path.read_text())
    worker = summary.get("worker") or {}
    forked = bool(worker.get("forked_from_warm"))
    if forked == cold:
        raise RuntimeError(f"a {'cold' if cold else 'warm'} run was {'forked' if forked else 'cold'}: "
                           f"{worker.get('warm_note', '')!r} ({out})")
    return {"mode": "cold" if cold else "warm", "wall_s": round(wall, 3), "exit": done.returncode,
            "worker_startup_s": worker.get("startup_s"), "forked_from_warm": forked,
            "violations": summary.get("violated_invariants")}


def start_warm_worker(target: str, log: Path) -> float:
    clock = time.monotonic()
    subprocess.run([*CLI, "worker", "--target", target, "--detach", "--idle-timeout", "900", "--log", str(log)],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - clock


def stop_warm_worker(target: str, python: str) -> None:
    """Stop the warm worker this benchmark started (found in its private socket folder) and wait for it."""
    from bench.isolation.warm_client import running_warm

    pid = running_warm(python, target)
    subprocess.run([*CLI, "worker", "--target", target, "--stop"], stdout=subprocess.DEVNULL, check=False)
    deadline = time.monotonic() + 20
    while pid is not None and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (the detached warm worker's parent, the CLI, is gone)."""
    stat = read_stat(pid)
    return stat is not None and not stat.ended


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.repro_warm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target NAME[:variant] (default miles when built, else ref-gather)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved cold/warm rounds (3)")
    parser.add_argument("--trace", default="agentic-500", help="trace (agentic-500)")
    parser.add_argument("--plan", default="seed-000", help="plan whose crash is reproduced (seed-000)")
    parser.add_argument("--trajectory", default="g00120-3", help="the trajectory the plan poisons (g00120-3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: ref-gather, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
        args.target = args.target or "ref-gather"
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from bench.isolation.warm_client import RUNTIME_ENV
    from bench.targets.frameworks.envs import target_python

    args = parse_args(argv)
    target = args.target or ("miles" if target_python("miles") else "ref-gather")
    python = target_python(target) or sys.executable
    info = machine()
    print(f"machine: {info['cores']} cores ({info['usable_cores']} usable), {info['cpu']}, Python {info['python']}, "
          f"{info['date']}")
    parameters = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "target": target,
                  "python": python}
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    scratch = Path(tempfile.mkdtemp(prefix="rb-repro-bench-"))
    runtime = Path(tempfile.mkdtemp(prefix="rbb-", dir="/tmp"))  # short: socket paths must fit 107 bytes
    previous = os.environ.get(RUNTIME_ENV)
    os.environ[RUNTIME_ENV] = str(runtime)  # this process and every command it starts
    runs: list[dict[str, Any]] = []
    warm_start_s = None
    try:
        repro, first_s = make_repro(target, args.trace, args.plan, args.trajectory, scratch / "repro.toml")
        print(f"repro of {args.plan} on {args.trajectory} written ({first_s:.1f} s for the run that made it)")
        warm_start_s = start_warm_worker(target, scratch / "warm.log")
        print(f"warm worker for {target} ready in {warm_start_s:.1f} s")
        for round_index in range(args.rounds):
            for cold in ((True, False) if round_index % 2 == 0 else (False, True)):
                mode = "cold" if cold else "warm"
                entry = timed_run(repro, scratch / f"{mode}-{round_index}", cold)
                runs.append({"round": round_index + 1, **entry})
                print(f"  round {round_index + 1} {mode}: {entry['wall_s']:.2f} s (worker start "
                      f"{entry['worker_startup_s']} s), violations {entry['violations']}", flush=True)
    finally:
        stop_warm_worker(target, python)
        if previous is None:
            os.environ.pop(RUNTIME_ENV, None)
        else:
            os.environ[RUNTIME_ENV] = previous
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)

    rows = []
    for mode in ("cold", "warm"):
        mine = [r for r in runs if r["mode"] == mode]
        rows.append({"mode": mode, "wall_s": round(median([r["wall_s"] for r in mine]), 3),
                     "worker_startup_s": round(median([float(r["worker_startup_s"] or 0) for r in mine]), 3),
                     "rounds_wall_s": [r["wall_s"] for r in mine],
                     "reproduced": all(r["exit"] == 1 and r["violations"] for r in mine)})
    cold_s, warm_s = rows[0]["wall_s"], rows[1]["wall_s"]
    for row in rows:
        row["ratio_to_cold"] = round(row["wall_s"] / cold_s, 3) if cold_s else float("nan")
    print()
    print_table(["run --repro", "wall s (median)", "ratio to cold", "worker start s", "rounds", "reproduced"],
                [[r["mode"], r["wall_s"], r["ratio_to_cold"], r["worker_startup_s"],
                  " ".join(f"{s:.2f}" for s in r["rounds_wall_s"]), r["reproduced"]] for r in rows])
    print(f"\n{target}: the warm worker took {warm_start_s:.1f} s to start once; a forked repro takes "
          f"{warm_s / cold_s:.2f} of a cold one ({cold_s - warm_s:.1f} s saved per run)")
    payload = {"benchmark": "repro_warm", "machine": info, "parameters": parameters, "rows": rows, "runs": runs,
               "warm_worker_start_s": round(warm_start_s or 0.0, 3)}
    json_path, csv_path = write_results(args.out, "repro_warm", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0 if all(r["reproduced"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
