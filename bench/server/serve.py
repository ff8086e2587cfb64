"""`rollout-bench serve`: the server alone, until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
from pathlib import Path
from typing import IO, Any, Callable

from .app import BenchServer
from .control import CONTROL_HEADER, is_loopback
from .profiles import DEFAULT_ENGINE

SPILL = "spill"  # under --log-dir: request-log chunks written while serving

async def serve(trace: str, *, host: str, port: int, log_dir: str | None = None, **options: Any) -> int:
    """Serve `trace` on host:port; print the URL; shut down cleanly on a signal."""
    server = BenchServer(trace, host=host, port=port, spill_dir=spill_folder(log_dir), **options)

    def banner(url: str) -> str:
        config = server.context.config
        build = "" if config.engine == DEFAULT_ENGINE else f", {config.engine} build"
        return (f"rollout-bench serving {server.context.store.path} at {url} "
                f"(SGLang {config.profile.version}{build}, time scale {config.time_scale})")

    return await serve_until_signalled(server, host, banner, log_dir)


def spill_folder(log_dir: str | None) -> Path | None:
    """Where a long-lived server's older request-log rows go while it runs (`RequestLog.retain`): `<log-dir>/spill`,
    created now so an unwritable --log-dir fails at start, not at shutdown; emptied into requests.csv at the end."""
    if not log_dir:
        return None
    folder = Path(log_dir) / SPILL
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--log-dir {log_dir}: cannot create {folder}: {error.strerror or error}") from None
    _claim(folder, log_dir)
    return folder


_CLAIMS: dict[Path, IO[str]] = {}  # log folders this process writes, each locked until it exits


def _claim(folder: Path, log_dir: str) -> None:
    """One server per log folder: two would overwrite each other's spilled chunks and final CSVs. The lock
    (`flock` on `spill/.owner`) goes with the process however it ends, so a killed server leaves no stale claim."""
    if folder.resolve() in _CLAIMS:
        return
    owner = open(folder / ".owner", "a+", encoding="utf-8")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner.seek(0)
        holder = owner.read().strip() or "another process"
        owner.close()
        raise ValueError(f"--log-dir {log_dir}: another server writes its logs there ({holder}); give each server "
                         "its own folder") from None
    owner.truncate(0)
    owner.write(f"pid {os.getpid()}\n")
    owner.flush()
    _CLAIMS[folder.resolve()] = owner


def _release(folder: Path) -> None:
    """The log folder's claim let go (its file removed while still locked), once its logs are written."""
    owner = _CLAIMS.pop(folder.resolve(), None)
    if owner is not None:
        (folder / ".owner").unlink(missing_ok=True)
        owner.close()


async def serve_until_signalled(server: BenchServer, host: str, banner: Callable[[str], str],
                                log_dir: str | None) -> int:
    """Start `server`, print `banner(url)` and its plan, serve until SIGINT or SIGTERM, then print what it did and
    write its logs to `log_dir` (the mock's `serve` and the live engine's `proxy` alike)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    url = await server.start()
    faults = server.context.faults
    print(banner(url), flush=True)
    print(f"fault plan {faults.plan.name!r}: {len(faults.plan.rules)} rules, seed {faults.plan.seed}", flush=True)
    if not is_loopback(host):
        print(f"warning: bound to {host}, reachable beyond this machine", file=sys.stderr, flush=True)
    if server.control_token is not None:
        print(f"control token for /bench/*: {server.control_token} (send it as {CONTROL_HEADER})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    log = server.log
    written: list[str] = []
    if log_dir:  # first: a parent that went away (its end of stdout closed) must not cost the logs
        folder = Path(log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            written = [f"request log: {log.write_csv(folder / 'requests.csv')}",
                       f"fault log: {faults.log.write_csv(folder / 'faults.csv')}"]
        except OSError as error:
            spilled = [path for _, path in log.chunks] + list(getattr(faults.log, "chunks", []))
            kept = f" (rows spilled while serving stay in {folder / SPILL})" if spilled else ""
            print(f"error: {error}{kept}", file=sys.stderr, flush=True)
            return 1
        for chunk in [path for _, path in log.chunks] + list(getattr(faults.log, "chunks", [])):  # in the CSVs now
            chunk.unlink(missing_ok=True)
        _release(folder / SPILL)
        try:
            (folder / SPILL).rmdir()
        except OSError:
            pass
    print(f"stopped after {len(server.log)} requests, {len(faults.log)} fault events", flush=True)
    silent = faults.never_fired()
    if silent:
        print(f"rules that never fired: {', '.join(silent)}", flush=True)
    if log.spill_failure is not None:
        print(f"request log: spilling to disk failed ({log.spill_failure}); {log.dropped} rows from seq "
              f"{log.dropped_from} on were dropped, {len(log) - log.dropped} kept", flush=True)
    elif log.dropped:
        print(f"request log: the first {log.dropped} rows were dropped, {len(log) - log.dropped} kept (without "
              f"--log-dir only the latest {log.window} stay)", flush=True)
    if getattr(faults.log, "spill_failure", None) is not None:
        print(f"fault log: spilling to disk failed ({faults.log.spill_failure}); {faults.log.dropped} events were "
              f"dropped", flush=True)
    for line in written:
        print(line, flush=True)
    return 0
