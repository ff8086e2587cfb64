"""`python -m benchmarks.invariant_scaling`: the invariants' CPU time grows linearly in records plus requests.

The aim (issue 18): every invariant, provenance included, runs in time linear in the sample records plus the
requests, so a run of 10x the trajectories costs the checks 10x, not 100x. This builds the same kind of run at
N and 10N trajectories (deterministic, seeded): groups of 4 tool-loop trajectories of `--turns` turns, each
turn a request whose prompt extends the last context with its answer and a tool output, every answer's tokens
and logprobs kept as the server keeps them (`ServedTokens`), one sample record per trajectory training on its
answers (loss mask 1) and masking the tool outputs (loss mask 0), a retried turn (a 503, then the answer) on
every 7th trajectory and a fault event (latency, delivered) on every 3rd. Then it times, in CPU seconds of
this process, what the runner does after the rollout: the fault events' reach, then every invariant, then the
per-sample provenance verdicts (`RunView` built fresh each round, so no memo carries over). Medians of
interleaved rounds; `per_trajectory_ratio` is (time at 10N / 10N) over (time at N / N): 1.0 is linear, 10 is
quadratic. The checks must find nothing on this run (every sample is what it was served): the benchmark
measures their full path, not an early exit.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from bench.invariants import INVARIANTS, Bounds, RunView, check_all, provenance
from bench.invariants.fault_reach import with_reach
from bench.records.request_log import RequestLog, RequestRecord
from bench.records.sample import SampleRecord
from bench.records.served_tokens import ServedTokens
from bench.replay.store import pack
from faults import FaultEvent

from .common import DEFAULT_OUT, machine, median, print_table, write_results

GROUP = 4
VOCAB = 1_700


def build_run(trajectories: int, turns: int, seed: int) -> dict[str, Any]:
    """The records, requests, fault events and served tokens of a clean tool-loop run of `trajectories`."""
    rng = random.Random(seed)
    log, served = RequestLog(), ServedTokens()
    records: list[SampleRecord] = []
    events: list[FaultEvent] = []
    dispatched: dict[str, str] = {}
    clock = 1_000_000.0
    for t in range(trajectories):
        trajectory, group = f"t{t:06d}", f"g{t // GROUP:05d}"
        dispatched[trajectory] = group
        context = [rng.randrange(VOCAB) for _ in range(rng.randint(200, 400))]
        response: list[int] = []
        logprobs: list[float] = []
        mask: list[int] = []
        for turn in range(turns):
            attempts = 2 if t % 7 == 3 and turn == 1 else 1
            for attempt in range(1, attempts + 1):
                clock += 0.01
                record = RequestRecord(started=clock, endpoint="/generate", rid=f"{trajectory}-{turn}-{attempt}",
                                       trajectory=trajectory, group=group, turn=turn, attempt=attempt,
                                       prompt_tokens=len(context))
                log.append(record)
                if attempt < attempts:  # a retried turn: refused, never played
                    record.status, record.error, record.latency_s = 503, "no available workers", 0.001
                    continue
                served.begin(record, pack(context))
                output = [rng.randrange(VOCAB) for _ in range(rng.randint(40, 160))]
                shown = [-rng.random() * 5 for _ in output]
                served.finish(record, context, output, shown, "0")
                record.status, record.completion_tokens, record.finish = 200, len(output), "stop"
                record.latency_s = 0.05
                if t % 3 == 0 and turn == turns // 2:
                    events.append(FaultEvent("slow", "latency", trajectory, group, turn, attempt, "/generate",
                                             record.rid or "", clock, "delayed 50 ms"))
                tool = [rng.randrange(VOCAB) for _ in range(rng.randint(20, 80))] if turn < turns - 1 else []
                response += output + tool
                logprobs += shown + [0.0] * len(tool)
                mask += [1] * len(output) + [0] * len(tool)
                context = context + output + tool
        records.append(SampleRecord(trajectory, group, "completed", prompt_length=len(context) - len(response),
                                    response_ids=response, logprobs=logprobs, loss_mask=mask,
                                    response_length=len(response), reward=1.0, weight_versions=["0"]))
    return {"records": records, "requests": log.records, "events": events, "served": served,
            "dispatched": dispatched, "duration_s": clock - 1_000_000.0}


class _Counted(list):  # type: ignore[type-arg]
    """A list that counts the passes made over it (each `iter`: a for loop, a comprehension, `list()`, `set()`)."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.passes += 1
        return super().__iter__()


def count_passes(run: dict[str, Any]) -> dict[str, dict[str, int]]:
    """How many times each step goes over the records, the requests and the fault events. Linear checks make a
    fixed number of passes whatever the run's size; a check that scans a log once per record or request makes
    as many passes as there are records, which this counts where a timing would only hint at it."""
    records, requests, logged = _Counted(run["records"]), _Counted(run["requests"]), _Counted(run["events"])
    counted = {"records": records, "requests": requests, "fault_events": logged}
    passes: dict[str, dict[str, int]] = {}

    def take(step: str) -> None:
        passes[step] = {name: logged.passes for name, logged in counted.items()}
        for logged in counted.values():
            logged.passes = 0

    events = _Counted(with_reach(logged, requests, records, None, set(), None))
    take("fault_reach")
    counted["fault_events"] = events  # the view's: the events with their reach
    view = RunView(records, requests, events, None, run["dispatched"], 131_072, False, duration_s=run["duration_s"],
                   emitted={r.trajectory: 1 for r in run["records"]}, served=run["served"])
    for name, check in INVARIANTS.items():
        check(view)
        take(name)
    return passes


def time_checks(run: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds of what the runner does after the rollout, per step, on a fresh view."""
    cpu: dict[str, float] = {}
    started = time.process_time()
    events = with_reach(list(run["events"]), run["requests"], run["records"], None, set(), None)
    cpu["fault_reach"] = time.process_time() - started
    view = RunView(run["records"], run["requests"], events, None, run["dispatched"], 131_072, False,
                   duration_s=run["duration_s"], bounds=Bounds(), emitted={r.trajectory: 1 for r in run["records"]},
                   served=run["served"])
    violations = []
    for name, check in INVARIANTS.items():  # in check_all's order; provenance's verdicts are memoised in the view
        began = time.process_time()
        violations += check(view)
        cpu[name] = time.process_time() - began
    began = time.process_time()
    labels = {t: a.label for t, a in provenance.assess(view).items()}
    cpu["provenance_labels"] = time.process_time() - began
    cpu["all"] = time.process_time() - started
    again = check_all(RunView(run["records"], run["requests"], events, None, run["dispatched"], 131_072, False,
                              duration_s=run["duration_s"], emitted={r.trajectory: 1 for r in run["records"]},
                              served=run["served"]))
    return {"cpu": cpu, "violations": [f"{v.invariant}: {v.message}" for v in violations + again],
            "matched": sum(label.startswith("match") for label in labels.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.invariant_scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="trajectories of the small run (the large one has 10x)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--quick", action="store_true", help="20 and 200 trajectories of 4 turns, one round")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.turns, args.rounds = 20, 4, 1
    sizes = (args.n, 10 * args.n)
    runs = {n: build_run(n, args.turns, args.seed) for n in sizes}
    time_checks(runs[sizes[0]])  # warm-up, not kept: first calls import fault classes and fill caches
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(args.rounds):
        for n in sizes:  # interleaved: a machine's drift hits both sizes alike
            rounds[n].append(time_checks(runs[n]))
    steps = list(rounds[sizes[0]][0]["cpu"])
    rows = []
    for step in steps:
        small, large = (median([r["cpu"][step] for r in rounds[n]]) for n in sizes)
        per_small, per_large = small / sizes[0], large / sizes[1]
        rows.append({"step": step, "small_cpu_s": small, "large_cpu_s": large,
                     "small_us_per_trajectory": per_small * 1e6, "large_us_per_trajectory": per_large * 1e6,
                     "per_trajectory_ratio": per_large / per_small if per_small > 0 else None})
    violations = sorted({v for n in sizes for r in rounds[n] for v in r["violations"]})
    passes = {str(n): count_passes(runs[n]) for n in sizes}
    growing = sorted(step for step in passes[str(sizes[0])] if passes[str(sizes[0])][step] != passes[str(sizes[1])][step])
    payload = {
        "machine": machine(),
        "parameters": {"n": args.n, "turns": args.turns, "rounds": args.rounds, "seed": args.seed, "quick": args.quick,
                       "group_size": GROUP},
        "sizes": {str(n): {"trajectories": n, "requests": len(runs[n]["requests"]),
                           "fault_events": len(runs[n]["events"]), "served_tokens": len(runs[n]["served"].ids),
                           "response_tokens": sum(len(r.response_ids) for r in runs[n]["records"]),
                           "matched": rounds[n][0]["matched"]} for n in sizes},
        "violations": violations,
        "passes": passes,  # per step, over the records, requests and fault events: the same at both sizes
        "passes_grow": growing,
        "rows": rows,
        "rounds": {str(n): [r["cpu"] for r in rounds[n]] for n in sizes},
    }
    print(f"invariants on {sizes[0]} and {sizes[1]} trajectories of {args.turns} turns (seed {args.seed}, "
          f"{args.rounds} round(s)); requests {len(runs[sizes[0]]['requests'])} and {len(runs[sizes[1]]['requests'])}")
    print_table(["step", f"CPU s at {sizes[0]}", f"CPU s at {sizes[1]}", "µs/trajectory", "µs/trajectory (10x)",
                 "ratio (1 = linear)"],
                [[r["step"], r["small_cpu_s"], r["large_cpu_s"], r["small_us_per_trajectory"],
                  r["large_us_per_trajectory"], r["per_trajectory_ratio"] if r["per_trajectory_ratio"] is not None
                  else "-"] for r in rows])
    print("passes over the records, requests and fault events: " + (
        "the same at both sizes for every step" if not growing else "MORE at 10x in " + ", ".join(
            f"{step} ({passes[str(sizes[0])][step]} -> {passes[str(sizes[1])][step]})" for step in growing)))
    print("violations: " + ("none (every check ran its full path)" if not violations else "; ".join(violations[:5])))
    json_path, _ = write_results(args.out, "invariant_scaling", payload, rows)
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
