"""Whether a sweep that `sweep.json` says is `running` still is: the reader's side of a SIGKILLed sweep.

A sweep marks itself `finished` or `interrupted` on every end it sees; SIGKILL it cannot see, and its `sweep.json`
then says `running` forever. It records its pid, host and start time, so whoever reads the file (`report`,
`bench.report.load` and the notebook, the next sweep into the same folder) can tell: on the same host, no such
process, or one that started after the sweep did (the pid was reused), means the sweep was killed outright."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.isolation.proc_stat import read_stat

KILLED = "killed"
_START_SLACK_S = 5.0  # the sweep records `started` a little after its process started


def process_gone(summary: dict[str, Any]) -> bool | None:
    """True: the sweep's process is gone; False: it still runs; None: cannot tell (another host, an old file)."""
    pid, host = summary.get("pid"), summary.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or host != os.uname().nodename:
        return None
    if not Path("/proc/self").exists():
        return None
    stat = read_stat(pid)
    if stat is None or stat.ended:  # a zombie is dead: its parent has not reaped it yet
        return True
    started = summary.get("started")
    if isinstance(started, (int, float)) and stat.started > started + _START_SLACK_S:  # this pid is a later process's
        return True
    return False


def effective_status(summary: dict[str, Any]) -> str:
    """`sweep.json`'s status as it really is: `killed` for a `running` sweep whose process is gone."""
    status = str(summary.get("status") or "")
    return KILLED if status == "running" and process_gone(summary) else status


def sweep_status_note(summary: dict[str, Any]) -> str:
    """One line on a sweep's status, saying so plainly when it was killed outright."""
    status = effective_status(summary)
    if status == KILLED:
        return (f"status killed: sweep.json says running, but its process (pid {summary.get('pid')}) is gone: the "
                f"sweep was killed outright; {summary.get('finished_runs', 0)} of {summary.get('runs')} runs finished")
    return f"status {status}" if status else ""


def existing_sweep_note(folder: Path) -> str:
    """For a folder a new sweep is pointed at: what sweep is already there, if any (`; ...`, or empty)."""
    import json

    try:
        summary = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(summary, dict):
        return ""
    status = effective_status(summary)
    if status == "running" and process_gone(summary) is False:
        return f"; a sweep (pid {summary.get('pid')}) is still running into it"
    if status == KILLED:
        return f"; it holds a sweep killed outright (pid {summary.get('pid')} is gone, " \
               f"{summary.get('finished_runs', 0)} of {summary.get('runs')} runs finished)"
    return f"; it holds a sweep ({status})" if status else ""
