"""`python -m benchmarks.served_memory`: what keeping every served token (for the provenance invariant) costs the
bench process in memory, on a long multi-turn run.

The claim (README, "Provenance"): on agentic-500 (500 trajectories, 5-50 turns each) the bench's peak RSS grows
by no more than the served data itself (token ids and logprobs, 12 bytes a token). This runs the same scenario
twice in fresh processes, `ref-tool-loop:fixed` on the whole trace with no faults: once as shipped, once with the
served-token store replaced by one that keeps nothing, and compares their RSS once the run is over (peak RSS is
shown too, but it is set by loading the trace) with the bytes the store held. The target runs in its worker
process, so the bench process's RSS is the server, the logs and the checks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import DEFAULT_OUT, machine, print_table, write_results

_CHILD = r"""
import json, resource, sys
from bench import RunConfig, run_blocking
if sys.argv[1] == "discard":
    from bench.records import served_tokens
    class Discard(served_tokens.ServedTokens):
        def begin(self, record, *args, **kwargs):
            record.served_tokens = 0
        def finish(self, *args, **kwargs):
            pass
    served_tokens.ServedTokens = Discard
    import bench.server.context as context
    context.ServedTokens = Discard
result = run_blocking(RunConfig(trace=sys.argv[2], target="ref-tool-loop:fixed", n=int(sys.argv[3])))
served = result.served
import gc
gc.collect()
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "end_rss_bytes": rss,
                  "served_tokens": len(served.ids), "served_bytes": served.nbytes(),
                  "requests": len(result.requests), "samples": len(result.records),
                  "violations": len(result.violations)}))
"""


def measure(mode: str, trace: str, n: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, trace, str(n)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    return {"store": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.served_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="agentic-500", help="trace (agentic-500)")
    parser.add_argument("--n", type=int, default=500, help="trajectories (500)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 trajectories")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = 40
    info = machine()
    print(f"machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}")
    rows = [measure("keep", args.trace, args.n), measure("discard", args.trace, args.n)]
    keep, discard = rows
    growth = keep["end_rss_bytes"] - discard["end_rss_bytes"]
    data = keep["served_bytes"]
    for row in rows:
        row["peak_rss_mb"] = round(row["peak_rss_bytes"] / 2**20, 1)
        row["end_rss_mb"] = round(row["end_rss_bytes"] / 2**20, 1)
    print_table(["store", "RSS at the end MB", "peak RSS MB", "requests", "samples", "served tokens"],
                [[r["store"], r["end_rss_mb"], r["peak_rss_mb"], r["requests"], r["samples"], r["served_tokens"]]
                 for r in rows])
    ratio = growth / data if data else float("nan")
    print(f"\nkeeping {keep['served_tokens']} served tokens ({data / 2**20:.1f} MB of ids and logprobs) grew the "
          f"bench's RSS (after the run, its report not yet written) by {growth / 2**20:.1f} MB: "
          f"{ratio:.2f}x the served data")
    payload = {"benchmark": "served_memory", "machine": info, "parameters": {"trace": args.trace, "n": args.n},
               "rows": rows, "rss_growth_bytes": growth, "served_bytes": data, "growth_to_data": round(ratio, 3)}
    json_path, csv_path = write_results(args.out, "served_memory", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
