"""`python -m benchmarks.trace_loading`: how fast the bench loads a big trace, and how much memory that takes.

The aim (issue 18): `TraceStore.load` (what the server does before it answers anything, checks included) reads at
least 100 MB of decompressed trace a second, and its peak RSS grows by at most 3x the decompressed size, on a
500-trajectory, 20-turn agentic trace of at least 200 MB. This synthesizes that trace with `rollout-bench synth`
into a temporary folder (seeded; the seed and the arguments are printed), writes the same records once gzipped (as
synth writes `.jsonl.gz`) and once plain, then loads each in a fresh process per round, interleaved: wall time of
the load, and peak RSS (VmHWM) minus the RSS before it, after the bench's imports. MB is 2**20 bytes. Those two rows
are cold loads (the trace cache off: every byte decompressed, decoded, checked and packed); the `cached` rows load
the same files again through a cache folder of the benchmark's own (`bench.replay.cache`), as a run does the second
time it meets a trace. MB/s is of the decompressed trace in every row.

The shipped agentic traces have 5-50 turns and tool outputs of ~60 tokens (median); `--turns` and
`--tool-output-tokens` (synth options) make every trajectory plan 20 turns with tool outputs of 1,900 tokens
(median, long-tailed), a 128k-token context: 220 MB for 500 trajectories. Some trajectories still end early
(a context overflow, a cut answer), as recorded ones do; the turn count is reported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import DEFAULT_OUT, machine, median, print_table, write_results

MB = 2**20
AIM_MB_PER_S = 100.0
AIM_MEMORY_RATIO = 3.0
AIM_DECOMPRESSED_MB = 200.0

_CHILD = r"""
import gc, json, os, sys, time
os.environ["ROLLOUT_BENCH_TRACE_CACHE"] = sys.argv[2]  # "off": a cold load; a folder: the cache it reads
from bench.replay import cache as trace_cache
from bench.replay.store import TraceStore

hits = []
_read = trace_cache.read
def counted_read(*args):  # whether this load was the cache's (the row says so; timings alone cannot)
    store = _read(*args)
    hits.append(store is not None)
    return store
trace_cache.read = counted_read

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

gc.collect()
before = status("VmRSS:")
clock, cpu = time.perf_counter(), time.process_time()
store = TraceStore.load(sys.argv[1])
wall, cpu = time.perf_counter() - clock, time.process_time() - cpu
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss_before_bytes": before, "peak_rss_bytes": status("VmHWM:"),
                  "rss_after_bytes": status("VmRSS:"), "trajectories": len(store.trajectories),
                  "turns": sum(len(t.turns) for t in store.trajectories), "cache_hit": any(hits)}))
"""


def synthesize(folder: Path, n: int, seed: int, turns: int, tool_output_tokens: int, context_length: int) -> Path:
    """The gzipped trace, made by the CLI as a user would; returns its path."""
    out = folder / f"agentic-{n}x{turns}-t{tool_output_tokens}-c{context_length}-s{seed}.jsonl.gz"
    if out.exists():
        print(f"reusing {out} (made by an earlier run with the same arguments)", flush=True)
        return out
    command = [sys.executable, "-m", "bench", "synth", "--kind", "agentic", "--n", str(n), "--seed", str(seed),
               "--turns", str(turns), "--tool-output-tokens", str(tool_output_tokens),
               "--context-length", str(context_length), "--out", str(out)]
    print("synthesizing:", " ".join(["rollout-bench", *command[3:]]), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"synth failed:\n{done.stderr[-3000:]}")
    return out


def decompress(path: Path) -> Path:
    """The same records as a plain `.jsonl` beside the gzipped file."""
    plain = path.with_suffix("")
    with gzip.open(path, "rb") as source, plain.open("wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
    return plain


def measure(path: Path, cache: str = "off") -> dict[str, Any]:
    """One load of `path` in a fresh interpreter; `cache`: "off" (a cold load, every step) or the cache folder."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), cache], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loading {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def settle_for_cache(*paths: Path) -> None:
    """Wait until the traces are older than the cache's racy window (`RACY_S`): a file modified within it is loaded,
    never cached, and a `--quick` run loads its trace a moment after writing it."""
    from bench.replay.cache import RACY_S

    newest = max(path.stat().st_mtime for path in paths)
    time.sleep(max(0.0, newest + RACY_S + 0.1 - time.time()))


def summarize(label: str, path: Path, decompressed: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of one file: medians over the rounds, and the figures the aims are about, computed from them."""
    wall = median([r["wall_s"] for r in rounds])
    growth = median([r["peak_rss_bytes"] - r["rss_before_bytes"] for r in rounds])
    speed = decompressed / MB / wall
    ratio = growth / decompressed
    return {
        "file": label, "file_bytes": path.stat().st_size, "decompressed_bytes": decompressed,
        "trajectories": rounds[0]["trajectories"], "turns": rounds[0]["turns"],
        "wall_s": wall, "cpu_s": median([r["cpu_s"] for r in rounds]), "mb_per_s": speed,
        "peak_rss_growth_bytes": growth, "memory_ratio": ratio,
        "speed_aim_holds": speed >= AIM_MB_PER_S, "memory_aim_holds": ratio <= AIM_MEMORY_RATIO,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_loading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500, help="trajectories (500)")
    parser.add_argument("--turns", type=int, default=20, help="turns each trajectory plans (20)")
    parser.add_argument("--tool-output-tokens", type=int, default=1900, help="median tool output, tokens (1900)")
    parser.add_argument("--context-length", type=int, default=131072, help="context budget, tokens (131072)")
    parser.add_argument("--seed", type=int, default=1, help="synth seed (1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--keep", type=Path, metavar="FOLDER",
                        help="synthesize into FOLDER and keep the traces there (reused when present), not a temp folder")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 8 trajectories of 5 turns, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.turns, args.tool_output_tokens, args.rounds = 8, 5, 200, 1
    info = machine()
    print(f"machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}")
    print(f"seed {args.seed}")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="trace-loading-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        clock = time.perf_counter()
        gz = synthesize(folder, args.n, args.seed, args.turns, args.tool_output_tokens, args.context_length)
        synth_s = time.perf_counter() - clock
        plain = gz.with_suffix("") if args.keep and gz.with_suffix("").exists() else decompress(gz)
        decompressed = plain.stat().st_size
        print(f"trace: {decompressed / MB:.1f} MB decompressed, {gz.stat().st_size / MB:.1f} MB gzipped "
              f"(synth took {synth_s:.0f} s)", flush=True)
        cache = folder / "cache"
        files = (("gz", gz, "off"), ("plain", plain, "off"), ("gz cached", gz, str(cache)),
                 ("plain cached", plain, str(cache)))
        settle_for_cache(gz, plain)
        for path in (gz, plain):  # the cache's entries, written by a first load of each (not measured)
            measure(path, str(cache))
        measured: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in files}
        for _ in range(args.rounds):
            for label, path, mode in files:
                measured[label].append(measure(path, mode))
        rows = [summarize(label, path, decompressed, measured[label]) for label, path, _ in files]
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print_table(["file", "file MB", "trajectories", "turns", "load s", "MB/s", "peak RSS growth MB", "x decompressed"],
                [[r["file"], r["file_bytes"] / MB, r["trajectories"], r["turns"], r["wall_s"], r["mb_per_s"],
                  r["peak_rss_growth_bytes"] / MB, r["memory_ratio"]] for r in rows])
    big_enough = decompressed / MB >= AIM_DECOMPRESSED_MB
    for row in rows:
        print(f"{row['file']}: {row['mb_per_s']:.0f} MB/s ({'meets' if row['speed_aim_holds'] else 'misses'} the "
              f"{AIM_MB_PER_S:.0f} MB/s aim), peak RSS growth {row['memory_ratio']:.2f}x the decompressed size "
              f"({'meets' if row['memory_aim_holds'] else 'misses'} the {AIM_MEMORY_RATIO:.0f}x aim)")
    if not big_enough:
        print(f"note: the trace is {decompressed / MB:.1f} MB, under the {AIM_DECOMPRESSED_MB:.0f} MB the aim is "
              f"measured on")
    payload = {"benchmark": "trace_loading", "machine": info,
               "parameters": {"n": args.n, "turns": args.turns, "tool_output_tokens": args.tool_output_tokens,
                              "context_length": args.context_length, "seed": args.seed, "rounds": args.rounds,
                              "quick": args.quick},
               "synth_s": synth_s, "decompressed_bytes": decompressed, "big_enough": big_enough,
               "aims": {"mb_per_s": AIM_MB_PER_S, "memory_ratio": AIM_MEMORY_RATIO,
                        "decompressed_mb": AIM_DECOMPRESSED_MB},
               "rows": rows}
    csv_rows = [{k: v for k, v in row.items() if k != "rounds"} for row in rows]
    json_path, csv_path = write_results(args.out, "trace_loading", payload, csv_rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
