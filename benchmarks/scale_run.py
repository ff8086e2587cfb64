"""`python -m benchmarks.scale_run [--phases] RESULT.json ARGS...`: one `rollout-bench ARGS...` in this process, then
its own wall time, CPU time and peak RSS written to RESULT.json.

Why a process of its own: `getrusage(RUSAGE_SELF)` then counts the bench alone (imports, trace loading, the
server, the checks, the report), never the target's worker, which is a child process with its own CPU and memory.

`--phases` also splits the run's CPU (`bench_cpu_s`) into its synchronous parts, each function's thread CPU time
summed over its calls (`PHASES`): loading the trace, decoding the worker's lines, the checks, and on the server's
`/generate` fast path each step of a request. What they leave is aiohttp, the event loop, the middleware and the
pacing. The wrappers cost about a microsecond a call: compare a `--phases` run with plain ones, not its total.
"""

from __future__ import annotations

import functools
import importlib
import json
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

# (module, attribute, label): where the run calls it from; a name imported into a module is wrapped there
PHASES = (
    ("bench.replay.store", "TraceStore.load", "trace load (decode, check, pack)"),
    ("bench.isolation.process", "decode", "worker lines decoded (records)"),
    ("bench.isolation.process", "record_from_dict", "records built"),
    ("bench.orchestration.runner", "check_all", "invariants (check_all)"),
    ("bench.orchestration.runner", "with_reach", "fault events' reach"),
    ("bench.invariants.provenance", "assess", "provenance verdicts"),
    ("bench.orchestration.watchdog", "ServedTurns.update", "watchdog progress"),
    ("bench.server.native", "accept", "/generate: body decoded, ids packed and range-checked"),
    ("bench.server.native", "logged_identified", "/generate: request log row"),
    ("bench.replay.identify", "Identifier.identify", "/generate: identified"),
    ("bench.server.context", "ServerContext.decide", "/generate: fault decisions"),
    ("bench.server.native", "_new_reply", "/generate: answer built (first request of a turn)"),
    ("bench.records.served_tokens", "ServedTokens.begin", "/generate: served-token entry (prompt hashed, parent found)"),
    ("bench.server.playback", "_finish", "/generate: played (paced answer done)"),
    ("bench.server.native", "played_at_once", "/generate: played (instant answer)"),
    ("bench.records.served_tokens", "ServedTokens.finish_packed", "/generate: served tokens kept"),
    ("bench.server.native_fast", "Reply.body", "/generate: body spliced"),
)
# called inside another phase above: reported, not subtracted again from the rest
NESTED = {"/generate: served tokens kept"}
# wrapping imports the server's modules before the run starts: a plain run imports them inside it (its bench_cpu_s
# counts them, a `--phases` run's does not), so their import time is reported beside the phases
IMPORTS = "server modules imported (inside the run when not split)"


def install_phases() -> tuple[Counter[str], Counter[str]]:
    """Wrap every `PHASES` function with a thread-CPU timer; (seconds, calls) by label, filled as the run goes."""
    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for module_name, attribute, label in PHASES:
        started = time.thread_time()
        module = importlib.import_module(module_name)
        seconds[IMPORTS] += time.thread_time() - started
        owner: Any = module
        name = attribute
        if "." in attribute:
            owner_name, name = attribute.split(".")
            owner = getattr(module, owner_name)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        is_classmethod = isinstance(raw, classmethod)
        function: Callable[..., Any] = raw.__func__ if is_classmethod else raw

        def timed(*args: Any, _function: Callable[..., Any] = function, _label: str = label, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return _function(*args, **kwargs)
            finally:
                seconds[_label] += time.thread_time() - started
                calls[_label] += 1

        functools.update_wrapper(timed, function)
        setattr(owner, name, classmethod(timed) if is_classmethod else timed)
    return seconds, calls


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    phases = bool(args) and args[0] == "--phases"
    args = args[1:] if phases else args
    if len(args) < 2:
        raise SystemExit("usage: python -m benchmarks.scale_run [--phases] RESULT.json ARGS... (rollout-bench's "
                         "arguments)")
    result, command = Path(args[0]), args[1:]
    clock = time.perf_counter()
    from bench.cli import main as rollout_bench  # its imports are part of what a run costs

    timed = install_phases() if phases else None
    code = rollout_bench(command)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report: dict[str, Any] = {"exit": code, "wall_s": time.perf_counter() - clock,
                              "cpu_s": usage.ru_utime + usage.ru_stime,
                              "peak_rss_bytes": usage.ru_maxrss * 1024}  # Linux: kB
    if timed is not None:
        seconds, calls = timed
        report["phases"] = [{"phase": label, "cpu_s": round(seconds[label], 4), "calls": calls[label],
                             "nested": label in NESTED} for _, _, label in PHASES]
        report["phases_imports_s"] = round(seconds[IMPORTS], 4)
    result.write_text(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
