"""What every benchmark shares: the machine it ran on, process CPU time, interleaved rounds, medians, the table
and its files."""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.isolation.proc_stat import read_stat

DEFAULT_OUT = Path("reports/bench")
Kind = TypeVar("Kind")  # what interleaved rounds rotate: a server's name, a (rate, server) cell


def machine() -> dict[str, Any]:
    """Enough to compare figures across machines: cores, CPU model, interpreter, date."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "usable_cores": len(usable_cores()), "cpu": model or platform.processor(),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (Linux /proc)."""
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(f"no process {pid} to read the CPU time of (/proc/{pid}/stat)")
    return stat.cpu_s


def threads_cpu_s(pid: int) -> float:
    """CPU seconds of a running process's live threads, to the nanosecond (each thread's scheduler run time, Linux
    /proc/<pid>/task/*/schedstat): `process_cpu_s` counts in clock ticks (10 ms), too coarse for a window of a
    few hundred cheap answers. A thread that ends inside a window takes its time with it: use it on servers whose
    threads live as long as they do."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # ended between the listing and the read
            continue
    return total / 1e9


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc): a server may answer from a worker its launcher forked."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:  # ended meanwhile
            continue
    return found


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (a reloader and its worker, say)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += process_cpu_s(member)
        except OSError:  # ended between the listing and the read
            pass
    return total


def usable_cores() -> list[int]:
    """The cores this process may run on (all of them where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pick_core(index: int | None, cores: list[int]) -> int | None:
    """The `index`-th usable core (wrapping around on a machine with fewer), or None: no pinning."""
    return None if index is None else cores[index % len(cores)]


def pin_to(core: int | None) -> int | None:
    """Pin this process to one core (a core number) when the platform allows it; the core, or None."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    os.sched_setaffinity(0, {core})
    return core


def add_window_arguments(parser: argparse.ArgumentParser, servers: str, connections: int = 64) -> None:
    """The measurement windows of a pinned server benchmark: their length, rounds (of `servers`), connections,
    warm-up."""
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per window (5)")
    parser.add_argument("--rounds", type=int, default=3, help=f"interleaved rounds of {servers} (3)")
    parser.add_argument("--concurrency", type=int, default=connections, help=f"keep-alive connections ({connections})")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before each window (0.5)")


def add_pinning_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the servers and the load generator run, where results go, and the smoke mode tests use."""
    parser.add_argument("--server-core", type=int, default=0, help="index among the usable cores for the servers (0)")
    parser.add_argument("--client-core", type=int, default=1,
                        help="index among the usable cores for the load generator (1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 0.3 s windows")


def check_window_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--quick` applied, and the window arguments in range (a parser error naming them otherwise)."""
    if args.quick:
        args.seconds, args.rounds, args.warmup = 0.3, 1, 0.1
    if args.seconds <= 0 or args.rounds < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--seconds and --concurrency must be > 0, --rounds >= 1, --warmup >= 0")


def start_pinned(args: Any) -> tuple[dict[str, Any], int | None, int | None, dict[str, Any]]:
    """What a benchmark of servers pinned to one core does first: pick the servers' core and pin this process (the load
    generator) to another (`args.server_core`, `args.client_core`: indices among the usable cores), warn when they
    are the same, and print the machine and the parameters. (machine, server core, client core, parameters)."""
    info = machine()
    cores = usable_cores()
    server_core, client_core = pick_core(args.server_core, cores), pin_to(pick_core(args.client_core, cores))
    if server_core == client_core:
        print(f"warning: only core {server_core} is usable: the load generator shares it with the servers, "
              "so the rates below are not the servers' alone", file=sys.stderr)
    parameters = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    print(f"machine: {info['cores']} cores ({info['usable_cores']} usable), {info['cpu']}, Python {info['python']}, "
          f"{info['date']}, load average {os.getloadavg()[0]:.2f}")
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in parameters.items()))
    return info, server_core, client_core, parameters


def interleaved(kinds: Sequence[Kind], rounds: int) -> Iterator[tuple[int, Kind]]:
    """(round, kind): every kind once per round, the order rotated by one each round, so a change on the
    machine during the run (another job starting) spreads over all kinds instead of landing on one."""
    for round_index in range(rounds):
        shift = round_index % len(kinds)
        for kind in [*kinds[shift:], *kinds[:shift]]:
            yield round_index, kind


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> float:
    """(max - min) / median of the rounds: how far single rounds strayed (0 for one round)."""
    middle = median(values)
    return (max(values) - min(values)) / middle if values and middle else float("nan")


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """A plain aligned table on stdout (numbers right-aligned)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    for row, raw in zip(cells, rows):
        print("  ".join(c.rjust(w) if isinstance(v, (int, float)) else c.ljust(w)
                        for c, w, v in zip(row, widths, raw)))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def write_results(out: Path, name: str, payload: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """`<out>/<name>.json` (everything) and `<out>/<name>.csv` (one line per row)."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out / f"{name}.json", out / f"{name}.csv"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    columns = list(rows[0]) if rows else []
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in row.items()})
    return json_path, csv_path
