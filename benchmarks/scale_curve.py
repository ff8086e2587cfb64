"""`python -m benchmarks.scale_curve`: how the bench's own cost grows with trajectories and turns.

Issue 18 asks whether a run costs the bench the same per request at 50 trajectories as at 5,000, and at 1 turn
as at 20. For every cell of the grid (trajectories x turns) this synthesizes an agentic trace with
`rollout-bench synth --kind agentic --turns T` (every trajectory plans T turns; some end early on a context
overflow or a cut answer, as recorded ones do) and runs `rollout-bench run` over it with a reference target
(`ref-tool-loop:fixed`, no fault plan, `--time-scale 0`: answers at once, so nothing but CPU paces the run).

The target runs in its worker process (the bench's default isolation), so the bench's figures are its own:
  run CPU        the bench process's CPU during the run (`bench_cpu_s` of the run's summary: server, replay,
                 checks), per generation request served
  process CPU    the whole bench process, start to exit: imports, trace loading, the run, invariants, the report
                 (`benchmarks.scale_run` reads its own rusage; the worker is a child and is not counted)
  peak RSS       the bench process's peak resident memory
  wall           the whole command, start to exit
The bench and the worker are not pinned: the scheduler shares the machine's cores between them.

Linearity: run CPU is fitted as a + b x requests (least squares); the report gives b (µs per request), R^2 and
each cell's deviation from the fit, and the same against requests and prompt tokens together (a long context
costs the bench more per request only if the tokens term carries weight).

`--run-cpu` measures issue 18's run instead of the grid: `rollout-bench run --target ref-tool-loop:fixed --plan
seed-004` over the shipped agentic-500 at the command line's time scale (0.05), `--rounds` times, each in its own
process; per round the bench's CPU per generation request (the summary's `bench_cpu_us_per_request`, aim 250 µs)
and its ratio to the target's CPU in the same run (the worker's: a ratio within one run holds better than a
figure across runs on a shared machine), with the load average. `--phases` adds one round split by phase
(`benchmarks.scale_run --phases`): what each synchronous part costs per request, and the rest (aiohttp, the event
loop, the middleware, the pacing). Results in `run_cpu.{json,csv,md}`. Every run loads its trace cold (the trace
cache off, so nothing is written to the user's cache either); `--run-cpu --trace-cache warm` reads agentic-500 back
from a cache folder of the benchmark's own instead, as a repeated nightly run does.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.replay.cache import CACHE_ENV

from .common import DEFAULT_OUT, machine, print_table, write_results

MB = 2**20
GENERATION_ROUTES = ("/generate", "/v1/chat/completions", "/v1/completions", "/inference/v1/generate")


def synthesize(folder: Path, n: int, turns: int, group_size: int, seed: int) -> tuple[Path, float]:
    """The trace of one cell, made by the CLI as a user would (reused when `folder` already has it)."""
    out = folder / f"agentic-{n}x{turns}-g{group_size}-s{seed}.jsonl.gz"
    if out.exists():
        return out, 0.0
    command = [sys.executable, "-m", "bench", "synth", "--kind", "agentic", "--n", str(n), "--seed", str(seed),
               "--turns", str(turns), "--group-size", str(group_size), "--out", str(out) + ".partial.jsonl.gz"]
    clock = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (status {done.returncode}): {done.stderr[-2000:]}")
    os.replace(str(out) + ".partial.jsonl.gz", out)
    return out, time.perf_counter() - clock


def decompressed_bytes(path: Path) -> int:
    total = 0
    with gzip.open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            total += len(chunk)
    return total


def run_cell(trace: Path, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One `rollout-bench run` over a cell's trace in its own process; its summary and requests joined with its
    rusage."""
    return run_measured(["--trace", str(trace), "--target", args.target, "--plan", "none", "--time-scale",
                         str(args.time_scale), "--concurrency", str(args.concurrency)], folder, trace.name)


def run_measured(run_args: list[str], folder: Path, name: str, *, phases: bool = False,
                 trace_cache: str = "off") -> dict[str, Any]:
    """`rollout-bench run RUN_ARGS` in its own process (`benchmarks.scale_run`), no repro reruns, no warm worker;
    its summary and requests joined with its rusage (and its CPU by phase, with `phases`). `trace_cache`: "off" (a
    cold load, and nothing written to the user's cache) or the cache folder the run reads (`bench.replay.cache`)."""
    report, result = folder / "report", folder / "rusage.json"
    command = [sys.executable, "-m", "benchmarks.scale_run", *(["--phases"] if phases else []), str(result), "run",
               *run_args, "--repro-reruns", "0", "--cold", "--out", str(report)]
    clock = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", CACHE_ENV: trace_cache},
                          cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - clock
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"rollout-bench run over {name} failed (status {done.returncode}):\n"
                          f"{done.stdout[-3000:]}")
    usage = json.loads(result.read_text())
    if usage["exit"] not in (0, 1):
        raise RuntimeError(f"rollout-bench run over {name} ended with status {usage['exit']}:\n"
                           f"{done.stdout[-3000:]}")
    summary = json.loads((report / "summary.json").read_text())
    prompt_tokens = completion_tokens = 0
    with (report / "requests.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["endpoint"] in GENERATION_ROUTES:
                prompt_tokens += int(row["prompt_tokens"] or 0)
                completion_tokens += int(row["completion_tokens"] or 0)
    throughput, fidelity = summary["throughput"], summary["fidelity"]
    requests = int(fidelity["requests"])
    return {"requests": requests, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "outcomes": {k: v for k, v in summary["outcomes"].items() if v},
            "violations": summary["violated_invariants"], "drifted": fidelity["drifted"], "exit": usage["exit"],
            "run_s": summary["duration_s"], "run_cpu_s": throughput["bench_cpu_s"],
            "run_cpu_us_per_request": throughput["bench_cpu_us_per_request"],
            "target_cpu_s": throughput.get("target_cpu_s"), "process_cpu_s": round(usage["cpu_s"], 3),
            "process_cpu_us_per_request": round(usage["cpu_s"] / requests * 1e6, 1) if requests else None,
            "wall_s": round(wall, 3), "peak_rss_mb": round(usage["peak_rss_bytes"] / MB, 1),
            **({"phases": usage["phases"], "phases_imports_s": usage["phases_imports_s"]} if phases else {})}


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """run CPU = a + b x requests, and = a + b x requests + c x prompt tokens; whole-process CPU = a + b x requests.

    Weighted by 1/CPU (relative errors), so a 50-request cell counts as much as the 100,000-request one; each
    cell's relative deviation from the fit says where the line bends. Also µs per request by turns."""
    if len(rows) < 3:
        return {"cells": len(rows), "note": "fewer than 3 cells: no fit"}
    requests = np.array([r["requests"] for r in rows], dtype=float)
    tokens = np.array([r["prompt_tokens"] for r in rows], dtype=float)

    def weighted(columns: list[np.ndarray], y: np.ndarray) -> dict[str, Any]:
        matrix = np.column_stack([np.ones_like(y), *columns])
        coefficients, *_ = np.linalg.lstsq(matrix / y[:, None], np.ones_like(y), rcond=None)
        deviation = (y - matrix @ coefficients) / (matrix @ coefficients)
        return {"coefficients": [float(c) for c in coefficients],
                "relative_deviation": [round(float(d), 3) for d in deviation],
                "max_abs_relative_deviation": round(float(np.abs(deviation).max()), 3)}

    run = weighted([requests], np.array([r["run_cpu_s"] for r in rows], dtype=float))
    both = weighted([requests, tokens], np.array([r["run_cpu_s"] for r in rows], dtype=float))
    process = weighted([requests], np.array([r["process_cpu_s"] for r in rows], dtype=float))
    by_turns: dict[str, dict[str, float]] = {}
    for r in rows:
        by_turns.setdefault(str(r["turns_planned"]), {})[str(r["trajectories"])] = r["run_cpu_us_per_request"]
    return {"cells": len(rows), "weighting": "1/CPU (relative errors)",
            "run_cpu": {"intercept_s": round(run["coefficients"][0], 3),
                        "us_per_request": round(run["coefficients"][1] * 1e6, 1),
                        "relative_deviation": run["relative_deviation"],
                        "max_abs_relative_deviation": run["max_abs_relative_deviation"]},
            "run_cpu_with_tokens": {"intercept_s": round(both["coefficients"][0], 3),
                                    "us_per_request": round(both["coefficients"][1] * 1e6, 1),
                                    "us_per_1k_prompt_tokens": round(both["coefficients"][2] * 1e9, 2),
                                    "relative_deviation": both["relative_deviation"],
                                    "max_abs_relative_deviation": both["max_abs_relative_deviation"]},
            "process_cpu": {"intercept_s": round(process["coefficients"][0], 3),
                            "us_per_request": round(process["coefficients"][1] * 1e6, 1),
                            "relative_deviation": process["relative_deviation"],
                            "max_abs_relative_deviation": process["max_abs_relative_deviation"]},
            "run_cpu_us_per_request_by_turns": by_turns}


def plot(rows: list[dict[str, Any]], fitted: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 5))
    figure.suptitle(title)
    turns = sorted({r["turns_planned"] for r in rows})
    colours = dict(zip(turns, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    top = max(r["requests"] for r in rows)
    for t in turns:
        cells = [r for r in rows if r["turns_planned"] == t]
        left.plot([r["requests"] for r in cells], [r["run_cpu_s"] for r in cells], "o", color=colours.get(t),
                  label=f"during the run, {t} turn(s) planned")
        left.plot([r["requests"] for r in cells], [r["process_cpu_s"] for r in cells], "^", color=colours.get(t),
                  alpha=0.6, label=f"whole process, {t} turn(s) planned")
        right.plot([r["trace_mb"] for r in cells], [r["peak_rss_mb"] for r in cells], "o", color=colours.get(t),
                   label=f"{t} turn(s) planned")
    for key, style, name in (("run_cpu", "-", "run"), ("process_cpu", "--", "process")):
        if key in fitted:
            line = fitted[key]
            left.plot([0, top], [line["intercept_s"], line["intercept_s"] + line["us_per_request"] * top / 1e6],
                      style, color="grey", label=f"{name} fit: {line['intercept_s']:.2f} s + "
                                                 f"{line['us_per_request']:.0f} µs/request (cells within "
                                                 f"{line['max_abs_relative_deviation']:.0%})")
    left.set(title="bench CPU", xlabel="generation requests served", ylabel="bench process CPU (s)")
    labels = [f"{r['trajectories']}×{r['turns_planned']}" for r in rows]
    x = np.arange(len(rows))
    middle.bar(x, [r["run_cpu_us_per_request"] or 0 for r in rows], 0.6, color=[colours.get(r["turns_planned"])
                                                                                   for r in rows])
    if "run_cpu" in fitted:
        middle.axhline(fitted["run_cpu"]["us_per_request"], color="grey", linestyle="-",
                       label=f"fitted slope {fitted['run_cpu']['us_per_request']:.0f} µs")
        middle.legend(fontsize=8)
    middle.set_xticks(x, labels, rotation=45)
    middle.set(title="bench CPU per request during the run", xlabel="trajectories × turns planned",
               ylabel="CPU per generation request (µs)")
    right.set(title="bench peak memory", xlabel="trace size, decompressed (MB)", ylabel="bench peak RSS (MB)")
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    for axes in (left, middle, right):
        low_x, high_x = axes.get_xlim()
        axes.set_xlim(-0.6 if axes is middle else 0, high_x if axes is middle else high_x * 1.05)
        axes.set_ylim(0, axes.get_ylim()[1] * 1.08)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def markdown(rows: list[dict[str, Any]], fitted: dict[str, Any], info: dict[str, Any], load: list[float],
             skipped: list[dict[str, Any]]) -> str:
    lines = [f"# Bench cost over trajectories and turns ({info['date']})", "",
             f"{info['cores']} cores, {info['cpu']}, Python {info['python']}; load average before the run "
             f"{load[0]:.2f} (1 min), {load[1]:.2f} (5 min).", "",
             "| trajectories | turns planned | requests | prompt tokens | run s | run CPU s | µs/request (run) | "
             "process CPU s | µs/request (process) | target CPU s | wall s | peak RSS MB | trace MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trajectories']} | {r['turns_planned']} | {r['requests']} | {r['prompt_tokens']} | "
                     f"{r['run_s']} | {r['run_cpu_s']} | {r['run_cpu_us_per_request']} | {r['process_cpu_s']} | "
                     f"{r['process_cpu_us_per_request']} | {r['target_cpu_s']} | {r['wall_s']} | {r['peak_rss_mb']} | "
                     f"{r['trace_mb']} |")
    for cell in skipped:
        lines.append(f"| {cell['trajectories']} | {cell['turns_planned']} | skipped: {cell['reason']} |" + " |" * 10)
    lines += ["", "Fits (weighted by 1/CPU): " + json.dumps(fitted), ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_curve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", default="50,500,5000", help="trajectory counts (50,500,5000)")
    parser.add_argument("--turns", default="1,5,20", help="turns every trajectory plans (1,5,20)")
    parser.add_argument("--group-size", type=int, default=5, help="trajectories per prompt (5)")
    parser.add_argument("--seed", type=int, default=1, help="synth seed (1)")
    parser.add_argument("--target", default="ref-tool-loop:fixed", help="the target run (ref-tool-loop:fixed)")
    parser.add_argument("--time-scale", type=float, default=0.0, help="replayed latency scale (0: at once)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at most (64)")
    parser.add_argument("--max-cell", type=int, default=25000,
                        help="skip cells planning more requests (trajectories x turns) than this: 5000 x 20 plans "
                             "100,000 and took 6 min alone on 2 shared cores (25000; 0: no limit)")
    parser.add_argument("--trace-dir", type=Path,
                        help="keep the synthesized traces here and reuse them (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 and 20 trajectories, 1 and 3 turns")
    parser.add_argument("--run-cpu", action="store_true",
                        help="measure the run aim's run (ref-tool-loop:fixed, seed-004, agentic-500) instead of the grid")
    parser.add_argument("--rounds", type=int, default=3, help="--run-cpu: runs measured (3)")
    parser.add_argument("--phases", action="store_true", help="--run-cpu: one more run, split by phase")
    parser.add_argument("--trace-cache", choices=("cold", "warm"), default="cold",
                        help="--run-cpu: load agentic-500 in every run (cold, the default) or read it back from a "
                             "trace cache a first load filled (warm)")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="only redraw the plot and the markdown table of an earlier run's scale_curve.json")
    args = parser.parse_args(argv)
    args.n = None  # --run-cpu: all of agentic-500 (--quick: its first 20 trajectories)
    if args.quick:
        args.trajectories, args.turns = "10,20", "1,3"
        args.rounds, args.n, args.phases = 1, 20, True
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        args.trajectories = [int(n) for n in args.trajectories.split(",")]
        args.turns = [int(t) for t in args.turns.split(",")]
    except ValueError:
        parser.error("--trajectories and --turns are comma-separated integers")
    bad = [n for n in args.trajectories if n < 1 or n % args.group_size]
    if bad or min(args.turns) < 1:
        parser.error(f"--trajectories must be positive multiples of --group-size {args.group_size} (not "
                     f"{', '.join(map(str, bad))}) and --turns at least 1")
    return args


def write_figures(out: Path, payload: dict[str, Any]) -> tuple[Path, Path]:
    """The markdown table and the plot, from the JSON payload (so an earlier run can be redrawn)."""
    parameters, info = payload["parameters"], payload["machine"]
    md_path, png_path = out / "scale_curve.md", out / "scale_curve.png"
    md_path.write_text(markdown(payload["rows"], payload["fit"], info, payload["load_average_before"],
                                payload.get("skipped", [])))
    plot(payload["rows"], payload["fit"], png_path,
         f"rollout-bench cost over trajectories and turns ({parameters['target']}, no faults, time scale "
         f"{parameters['time_scale']:g}; {info['date'][:10]}, {info['cores']} cores shared)")
    return md_path, png_path


RUN_CPU_AIM_US = 250.0  # issue 18: bench CPU per served request in this run, provenance and invariants included
RUN_CPU_ARGS = ["--target", "ref-tool-loop:fixed", "--plan", "seed-004"]  # over agentic-500, time scale 0.05


def run_cpu(args: argparse.Namespace) -> int:
    """Issue 18's run, `--rounds` times (and once split by phase with `--phases`)."""
    info = machine()
    parameters = {"command": "rollout-bench run " + " ".join(RUN_CPU_ARGS), "trace": "agentic-500",
                  "rounds": args.rounds, "n": args.n, "phases": args.phases, "trace_cache": args.trace_cache,
                  "aim_us_per_request": RUN_CPU_AIM_US}
    print(f"machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}")
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    run_args = RUN_CPU_ARGS + (["--n", str(args.n)] if args.n else [])
    scratch = Path(tempfile.mkdtemp(prefix="rb-run-cpu-"))
    rows: list[dict[str, Any]] = []
    split: dict[str, Any] | None = None
    trace_cache = "off"
    try:
        if args.trace_cache == "warm":  # a cache of the benchmark's own, its entry written by a load not measured
            trace_cache = str(scratch / "trace-cache")
            subprocess.run([sys.executable, "-c", "from bench.replay.store import TraceStore; from bench.trace.shipped "
                            "import resolve_trace; TraceStore.load(resolve_trace('agentic-500'))"], check=True,
                           env={**os.environ, CACHE_ENV: trace_cache}, cwd=Path(__file__).resolve().parent.parent)
        for number in range(1, args.rounds + 1 + args.phases):
            phases = number > args.rounds
            load = os.getloadavg()[0]
            cell = run_measured(run_args, scratch / f"round-{number}", "agentic-500", phases=phases,
                                trace_cache=trace_cache)
            ratio = round(cell["run_cpu_s"] / cell["target_cpu_s"], 3) if cell.get("target_cpu_s") else None
            row = {"round": "phases" if phases else number, "load_1min": round(load, 2), **cell,
                   "bench_to_target_cpu": ratio}
            print(f"  {'split' if phases else f'round {number}'}: {row['requests']} requests, bench CPU "
                  f"{row['run_cpu_s']:.3f} s = {row['run_cpu_us_per_request']} µs/request, target CPU "
                  f"{row['target_cpu_s']} s (bench/target {ratio}), load average {load:.2f}", flush=True)
            if phases:
                split = row
            else:
                rows.append(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    median_us = statistics.median(r["run_cpu_us_per_request"] for r in rows)
    ratios = [r["bench_to_target_cpu"] for r in rows if r["bench_to_target_cpu"] is not None]
    verdict = {"median_us_per_request": median_us, "median_bench_to_target_cpu": statistics.median(ratios)
               if ratios else None, "aim_us_per_request": RUN_CPU_AIM_US, "aim_holds": median_us <= RUN_CPU_AIM_US}
    print(f"\nmedian {median_us} µs of bench CPU per request (aim {RUN_CPU_AIM_US:g}: "
          f"{'holds' if verdict['aim_holds'] else 'not reached'}), "
          f"bench/target CPU {verdict['median_bench_to_target_cpu']}")
    table = phase_table(split) if split else []
    for line in table:
        print(f"  {line['us_per_request']:>8} µs/request  {line['phase']}")
    payload = {"benchmark": "run_cpu", "machine": info, "load_average_after": os.getloadavg(),
               "parameters": parameters, "rows": rows, "verdict": verdict, "split": split, "phase_table": table}
    json_path, csv_path = write_results(args.out, "run_cpu", payload, rows)
    md_path = args.out / "run_cpu.md"
    md_path.write_text(run_cpu_markdown(payload))
    print(f"wrote {json_path}, {csv_path} and {md_path}")
    return 0


def phase_table(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The split round's CPU per request by phase, the rest (aiohttp, event loop, middleware, pacing) last."""
    requests = row["requests"] or 1
    lines = [{"phase": p["phase"], "cpu_s": p["cpu_s"], "calls": p["calls"], "nested": p["nested"],
              "us_per_request": round(p["cpu_s"] / requests * 1e6, 1)} for p in row["phases"]]
    rest = row["run_cpu_s"] - sum(p["cpu_s"] for p in row["phases"] if not p["nested"])
    lines.append({"phase": "the rest: aiohttp, event loop, middleware, pacing, start-up", "cpu_s": round(rest, 4),
                  "calls": None, "nested": False, "us_per_request": round(rest / requests * 1e6, 1)})
    lines.append({"phase": "server modules imported (before the split run; inside a plain one)",
                  "cpu_s": row["phases_imports_s"], "calls": None, "nested": True,
                  "us_per_request": round(row["phases_imports_s"] / requests * 1e6, 1)})
    return lines


def run_cpu_markdown(payload: dict[str, Any]) -> str:
    info, verdict = payload["machine"], payload["verdict"]
    lines = [f"# Bench CPU in the run aim's run ({info['date']})", "",
             f"{info['cores']} cores, {info['cpu']}, Python {info['python']}; "
             f"`{payload['parameters']['command']}` over agentic-500.", "",
             "| round | load (1 min) | requests | bench CPU s | µs/request | target CPU s | bench/target CPU |",
             "|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        lines.append(f"| {r['round']} | {r['load_1min']} | {r['requests']} | {r['run_cpu_s']} | "
                     f"{r['run_cpu_us_per_request']} | {r['target_cpu_s']} | {r['bench_to_target_cpu']} |")
    lines += ["", f"Median {verdict['median_us_per_request']} µs per request (aim {verdict['aim_us_per_request']:g}: "
              f"{'holds' if verdict['aim_holds'] else 'not reached'}).", ""]
    if payload["phase_table"]:
        split = payload["split"]
        lines += [f"Split by phase (one more run, {split['requests']} requests, {split['run_cpu_us_per_request']} "
                  "µs/request; nested: inside the phase above it):", "", "| phase | CPU s | calls | µs/request |",
                  "|---|---|---|---|"]
        lines += [f"| {p['phase']}{' (nested)' if p['nested'] else ''} | {p['cpu_s']} | {p['calls'] or ''} | "
                  f"{p['us_per_request']} |" for p in payload["phase_table"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_cpu:
        return run_cpu(args)
    if args.replot:
        payload = json.loads(args.replot.read_text())
        payload["fit"] = fit(payload["rows"])
        args.replot.write_text(json.dumps(payload, indent=2) + "\n")
        md_path, png_path = write_figures(args.replot.parent, payload)
        print(f"wrote {md_path} and {png_path}")
        return 0
    info, load = machine(), os.getloadavg()
    parameters = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    print(f"machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    scratch = Path(tempfile.mkdtemp(prefix="rb-scale-"))
    traces = args.trace_dir or scratch / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    clock = time.perf_counter()
    try:
        for n in args.trajectories:
            for turns in args.turns:
                if args.max_cell and n * turns > args.max_cell:
                    skipped.append({"trajectories": n, "turns_planned": turns,
                                    "reason": f"{n * turns} planned requests, over --max-cell {args.max_cell}"})
                    print(f"  {n:>5} x {turns:>2} turns: skipped, {skipped[-1]['reason']} (--max-cell 0 runs it)",
                          flush=True)
                    continue
                trace, synth_s = synthesize(traces, n, turns, args.group_size, args.seed)
                cell = run_cell(trace, scratch / f"run-{n}x{turns}", args)
                row = {"trajectories": n, "turns_planned": turns, **cell,
                       "trace_mb": round(decompressed_bytes(trace) / MB, 2), "synth_s": round(synth_s, 1)}
                rows.append(row)
                print(f"  {n:>5} x {turns:>2} turns: {row['requests']:>6} requests, run CPU {row['run_cpu_s']:.2f} s "
                      f"({row['run_cpu_us_per_request']} µs/request), process CPU {row['process_cpu_s']:.2f} s, "
                      f"wall {row['wall_s']:.1f} s, peak RSS {row['peak_rss_mb']:.0f} MB, trace {row['trace_mb']} MB"
                      + (f", synth {synth_s:.1f} s" if synth_s else ", trace reused"), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - clock
    fitted = fit(rows)
    print()
    print_table(["trajectories", "turns", "requests", "run s", "run CPU s", "us/req run", "process CPU s",
                 "us/req process", "target CPU s", "wall s", "peak RSS MB", "trace MB"],
                [[r["trajectories"], r["turns_planned"], r["requests"], r["run_s"], r["run_cpu_s"],
                  r["run_cpu_us_per_request"], r["process_cpu_s"], r["process_cpu_us_per_request"],
                  r["target_cpu_s"], r["wall_s"], r["peak_rss_mb"], r["trace_mb"]] for r in rows])
    if "run_cpu" in fitted:
        line, tokens = fitted["run_cpu"], fitted["run_cpu_with_tokens"]
        deviations = ", ".join(f"{d:+.0%}" for d in line["relative_deviation"])
        print(f"\nfits weighted by 1/CPU (each cell by its relative error):\n"
              f"run CPU = {line['intercept_s']} s + {line['us_per_request']} µs x requests; cells deviate by at most "
              f"{line['max_abs_relative_deviation']:.0%} ({deviations})")
        print(f"run CPU = {tokens['intercept_s']} s + {tokens['us_per_request']} µs x requests + "
              f"{tokens['us_per_1k_prompt_tokens']} µs per 1k prompt tokens; cells deviate by at most "
              f"{tokens['max_abs_relative_deviation']:.0%}")
        process = fitted["process_cpu"]
        print(f"whole process CPU = {process['intercept_s']} s + {process['us_per_request']} µs x requests (at most "
              f"{process['max_abs_relative_deviation']:.0%} off): the intercept is imports, start-up and the report")
        for turns, cells in fitted["run_cpu_us_per_request_by_turns"].items():
            print(f"  {turns} turn(s): µs per request during the run by trajectories: "
                  + ", ".join(f"{n}: {us}" for n, us in cells.items()))
    print(f"grid took {total_s:.0f} s (synthesis included); load average now "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    payload = {"benchmark": "scale_curve", "machine": info, "load_average_before": load,
               "load_average_after": os.getloadavg(), "parameters": parameters, "rows": rows, "skipped": skipped,
               "fit": fitted,
               "grid_s": round(total_s, 1)}
    json_path, csv_path = write_results(args.out, "scale_curve", payload, rows)
    md_path, png_path = write_figures(args.out, payload)
    print(f"wrote {json_path}, {csv_path}, {md_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
