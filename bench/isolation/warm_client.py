"""The harness side of warm workers: find one, get a forked worker from it, or start one.

A warm worker (`warm.py`) is found by its socket, one per (interpreter, framework): the path
depends on the interpreter's location and the target's name without its variant, so
`miles` and `miles:patched` share one. `fork_from_warm` hands over the run's pipes and returns
an object with the parts of `asyncio.subprocess.Process` that `IsolatedTarget` uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

RUNTIME_ENV = "ROLLOUT_BENCH_RUNTIME_DIR"


class WarmStartError(RuntimeError):
    """`rollout-bench worker` could not start a warm worker (the target failed to load, a bad interpreter)."""


def runtime_dir(create: bool = True) -> Path:
    """Where warm workers' sockets live: $ROLLOUT_BENCH_RUNTIME_DIR, else per user under the temp folder.
    Made only by a warm worker's start (`create`): a run that merely looks for one leaves nothing behind."""
    folder = Path(os.environ.get(RUNTIME_ENV) or Path(tempfile.gettempdir()) / f"rollout-bench-{os.getuid()}")
    if create:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def socket_path(python: str, spec: str, create: bool = False) -> Path:
    framework = spec.split(":", 1)[0]
    digest = hashlib.sha1(os.path.abspath(python).encode()).hexdigest()[:10]
    # short: a Unix socket path must fit in 107 bytes
    return runtime_dir(create) / f"w-{framework.replace('/', '_')[:24]}-{digest}.sock"


def default_log(python: str, spec: str) -> Path:
    """A warm worker's log when none is given: beside its socket and pid file, in its own runtime folder; it goes when
    the warm worker does (its exit, a failed start, or the next look at one killed outright), nothing in the temp
    folder outlives it."""
    return socket_path(python, spec).with_suffix(".log")


class WarmProcess:
    """A worker forked by a warm worker: pipes like a subprocess's; its exit status comes over the socket."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 control: asyncio.StreamReader, control_writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._control, self._control_writer = control, control_writer
        self._exited = asyncio.ensure_future(self._wait_exit())

    async def _wait_exit(self) -> int:
        line = await self._control.readline()
        status = json.loads(line).get("exit") if line else None
        # no status: the warm worker itself ended; the child is in its own session and the harness kills it
        self.returncode = status if isinstance(status, int) else -1
        self._control_writer.close()
        self.stdin.close()
        return self.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def fork_from_warm(python: str, spec: str, options: dict[str, Any], stack_fds: tuple[int, int], log_fd: int,
                         env: dict[str, str], limit: int) -> tuple[WarmProcess | None, str]:
    """A worker forked from the warm worker for (python, spec), or (None, why not) to start a cold one."""
    path = socket_path(python, spec)
    if not path.exists():
        return None, ""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError as error:
        conn.close()
        return None, f"warm worker at {path} did not answer ({error})"
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    request = {"spec": spec, "options": options, "cwd": os.getcwd(), "env": env}
    try:  # stdin, stdout, stderr (the log pipe), then the two stack files
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [stdin_read, stdout_write, log_fd, *stack_fds])
    except OSError as error:
        for fd in (stdin_read, stdin_write, stdout_read, stdout_write):
            os.close(fd)
        conn.close()
        return None, f"warm worker at {path} did not take the run ({error})"
    os.close(stdin_read)
    os.close(stdout_write)
    control, control_writer = await asyncio.open_unix_connection(sock=conn)
    answer = json.loads(await asyncio.wait_for(control.readline(), timeout=30.0) or b"{}")
    if "pid" not in answer:
        for fd in (stdin_write, stdout_read):
            os.close(fd)
        control_writer.close()
        return None, f"warm worker at {path} refused the run: {answer.get('refused', 'no answer')}"
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(stdout_read, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        os.fdopen(stdin_write, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return WarmProcess(int(answer["pid"]), writer, reader, control, control_writer), ""


def running_warm(python: str, spec: str) -> int | None:
    """The pid of the warm worker for (python, spec), or None; the files of one killed outright are cleared."""
    path = socket_path(python, spec)
    pid_file = path.with_suffix(".pid")
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        default_log(python, spec).unlink(missing_ok=True)
        return None
    return pid


def stop_warm(python: str, spec: str) -> int | None:
    """Ask the warm worker for (python, spec) to exit (it removes its socket); its pid, or None if none ran."""
    pid = running_warm(python, spec)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    return pid


def start_warm(python: str, spec: str, options: dict[str, Any], idle_s: float, env: dict[str, str],
               log_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start a warm worker for (python, spec) and wait until it imported the target; its stderr goes to `log_path`."""
    path = socket_path(python, spec, create=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen([python, "-m", "bench.isolation.warm", str(path), spec, json.dumps(options),
                                    str(idle_s)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                   env=env, start_new_session=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        message = json.loads(line) if line.strip() else {}
    except json.JSONDecodeError:
        message = {"fatal": f"unexpected output {line[:200]!r}"}
    if "ready" not in message:
        process.wait()
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        if log_path == default_log(python, spec):  # shown below; a log given by the user stays
            log_path.unlink(missing_ok=True)
        raise WarmStartError(f"warm worker for {spec!r} under {python} did not start "
                             f"({message.get('fatal', f'exit status {process.returncode}')}); its log ends:\n{tail}")
    return process, message
