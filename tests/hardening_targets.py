"""Targets for the hardening tests: ones that never call the server, exit, escape their process group, or
print without end. Plugged in by `module:attr`, as a user's own would be.

Options (`--target-option KEY=VALUE`): `pidfile` (write "worker_pid child_pid [escaped_pid]" there once
running), `setsid` (also start a child in a session of its own, out of the worker's process group),
`print_mb` (write that many MiB to stdout before going on), `end` (`hang`: wait forever after all that).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from bench import Emit, RolloutJob, SampleRecord


class NeverCallsTheServer:
    """Emits a completed, empty record for every trajectory and sends no request: a test that tests nothing."""

    name = "tests:never-calls-the-server"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        for spec in job.trajectories:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))


class CallsSysExit:
    """Calls `sys.exit(3)` inside the rollout, as framework code that gives up sometimes does."""

    name = "tests:calls-sys-exit"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        sys.exit(3)


class Escapes:
    """Starts `sleep` children (one in a new session when `setsid`), prints `print_mb` MiB, then emits every
    record, or hangs (`end=hang`)."""

    name = "tests:escapes"
    fail_fast = False
    defaults: dict[str, object] = {}

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        options = {**self.defaults, **job.options}
        child = subprocess.Popen(["sleep", "300"])
        escaped = subprocess.Popen(["sleep", "301"], start_new_session=True) if options.get("setsid") else None
        chunk = "x" * 1023 + "\n"
        for _ in range(int(float(options.get("print_mb", 0)) * 1024)):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        if options.get("pidfile"):
            path = Path(str(options["pidfile"]))
            pids = [os.getpid(), child.pid] + ([escaped.pid] if escaped else [])
            path.with_suffix(".tmp").write_text(" ".join(map(str, pids)) + "\n")
            path.with_suffix(".tmp").rename(path)  # the test reads whole lines only
        if options.get("end") == "hang":
            await asyncio.Event().wait()
        for spec in job.trajectories:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))


class EscapesAndHangs(Escapes):
    """`Escapes` with a child in a session of its own and a hang, without options (a sweep passes none)."""

    name = "tests:escapes-and-hangs"
    defaults = {"setsid": True, "end": "hang"}


class ChildrenOnCue:
    """For overlapping inline runs: starts a `sleep` child in a session of its own at once, another once the file
    `<dir>/<name>.more` exists, keeps their pids in `<dir>/<name>.pids` (whole lines), and ends (emitting every
    record) once `<dir>/<name>.end` exists."""

    name = "tests:children-on-cue"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        folder, name = Path(str(job.options["dir"])), str(job.options["name"])
        pids = [subprocess.Popen(["sleep", "300"], start_new_session=True).pid]
        _write_pids(folder / f"{name}.pids", pids)
        while not (folder / f"{name}.end").exists():
            if len(pids) == 1 and (folder / f"{name}.more").exists():
                pids.append(subprocess.Popen(["sleep", "301"], start_new_session=True).pid)
                _write_pids(folder / f"{name}.pids", pids)
            await asyncio.sleep(0.02)
        for spec in job.trajectories:
            emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids)))


def _write_pids(path: Path, pids: list[int]) -> None:
    path.with_suffix(".tmp").write_text(" ".join(map(str, pids)) + "\n")
    path.with_suffix(".tmp").rename(path)
