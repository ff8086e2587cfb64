"""One reader of `/proc/<pid>/stat` (Linux): a process's state, parent, CPU time and start time.

The sweep's liveness check (is the pid in `sweep.json` still that sweep?), the process-tree walk that finds escaped
runs, and the benchmarks' CPU accounting all read this one line; its second field (the command name, in parentheses)
may itself hold spaces and parentheses, so the fields are counted from the LAST `)`."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    state: str  # R, S, D, Z (zombie: ended, not reaped yet), X (dead) ...
    ppid: int
    cpu_s: float  # user + system CPU seconds, every thread
    start_ticks: int  # clock ticks after boot at which it started: with the pid, names the process for good

    @property
    def ended(self) -> bool:
        """Ended, though its entry still shows (a zombie its parent has not reaped yet)."""
        return self.state in ("Z", "X")

    @property
    def started(self) -> float:
        """Unix time it started."""
        return boot_time() + self.start_ticks / os.sysconf("SC_CLK_TCK")


def read_stat(pid: int | str) -> ProcStat | None:
    """The process's stat line, or None when there is none to read (no such process, no /proc, unreadable)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        fields = text.rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return ProcStat(state=fields[0], ppid=int(fields[1]), cpu_s=(int(fields[11]) + int(fields[12])) / ticks,
                        start_ticks=int(fields[19]))
    except (IndexError, ValueError):  # not a stat line (a /proc this code does not know)
        return None


@functools.cache
def boot_time() -> float:
    """Unix time the machine booted (`btime` of /proc/stat; 0 where there is none)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0
