"""`python -m benchmarks.scale_run RESULT.json ARGS...`: one `rollout-bench ARGS...` in this process, then its own
wall time, CPU time and peak RSS written to RESULT.json.

Why a process of its own: `getrusage(RUSAGE_SELF)` then counts the bench alone (imports, trace loading, the
server, the checks, the report), never the target's worker, which is a child process with its own CPU and memory.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit("usage: python -m benchmarks.scale_run RESULT.json ARGS... (rollout-bench's arguments)")
    result, command = Path(args[0]), args[1:]
    clock = time.perf_counter()
    from bench.cli import main as rollout_bench  # its imports are part of what a run costs

    code = rollout_bench(command)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result.write_text(json.dumps({"exit": code, "wall_s": time.perf_counter() - clock,
                                  "cpu_s": usage.ru_utime + usage.ru_stime,
                                  "peak_rss_bytes": usage.ru_maxrss * 1024}) + "\n")  # Linux: kB
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
