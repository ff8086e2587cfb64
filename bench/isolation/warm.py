"""`python -m bench.isolation.warm SOCKET TARGET OPTIONS IDLE_S`: a target kept imported, forked per run.

miles takes 7-10 s to import on a 2-core machine (torch, megatron.core, transformers), more than
the rollout a repro replays. A warm worker pays that once: it loads the target and its `warm_up`,
then listens on a Unix socket; each run that finds the socket sends the ends of its pipes
(stdin, stdout, the log) and its stack files and gets a child `fork`ed from the warm process, which is an ordinary
worker (`worker.main`) in a new session: same protocol, same `os._exit`, killed by process group,
so isolation is what a cold worker gives. Nothing a run does reaches the warm process: frameworks
make their clients and singletons during the run, in the child.

A fork runs the code imported at warm-up. When any file behind an imported module changes (your fix
to the framework, a bench upgrade) the warm worker refuses the run, names the file and exits; the run
falls back to a cold worker. It also exits after IDLE_S seconds without a run, or on SIGTERM/SIGINT.

Control messages are JSON lines on the connection: the run sends {spec, options, cwd, env} with five
descriptors (stdin, stdout, the log pipe, the two stack files); the warm worker answers {"pid": N} or {"refused": why}, then
{"exit": status} when the child ends.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from . import worker

MAX_REQUEST = 1 << 20


def fingerprint() -> dict[str, int]:
    """Modification time of every file behind an imported module: the code a fork would run."""
    stamps: dict[str, int] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path not in stamps:
            try:
                stamps[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    return stamps


def changed_files(before: dict[str, int]) -> list[str]:
    changed = []
    for path, stamp in before.items():
        try:
            if os.stat(path).st_mtime_ns != stamp:
                changed.append(path)
        except OSError:
            changed.append(path)
    return changed


def _send(conn: socket.socket, **message: Any) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the run went away; its child is killed by its process group


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 5)
    while not data.endswith(b"\n"):
        more = conn.recv(MAX_REQUEST)
        if not more:
            break
        data += more
    if len(fds) != 5:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected 5 descriptors (stdin, stdout, log, thread stacks, task stacks), got {len(fds)}")
    return json.loads(data), fds


def _become_worker(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the run's pipes and environment, then run as an ordinary worker."""
    try:
        os.setsid()  # its own process group: the harness kills it and its children together
        for target_fd, fd in enumerate(fds[:3]):
            os.dup2(fd, target_fd)
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        worker.main([request["spec"], json.dumps(request["options"]), f"fd:{fds[3]},{fds[4]}"],
                    parent_is_harness=False)
    finally:
        os._exit(5)  # worker.main never returns; this only runs if setting up the child failed


def serve(socket_path: Path, spec: str, options: dict[str, Any], idle_s: float) -> int:
    from bench.targets import resolve_target

    target = resolve_target(spec)
    warm_up = getattr(target, "warm_up", None)
    if warm_up is not None:
        warm_up(options)
    stamps = fingerprint()
    socket_path.unlink(missing_ok=True)
    socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # another warm worker's exit may have removed it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    os.chmod(socket_path, 0o600)
    pid_file = socket_path.with_suffix(".pid")
    pid_file.write_text(f"{os.getpid()}\n")  # `rollout-bench worker --stop` reads it
    listener.listen(16)
    listener.setblocking(False)
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(json.dumps({"ready": str(socket_path), "pid": os.getpid(), "target": target.name}), flush=True)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    last_active = time.monotonic()
    try:
        while not stop:
            for _ in selector.select(timeout=0.1):
                conn, _ = listener.accept()
                conn.setblocking(True)
                conn.settimeout(10.0)
                last_active = time.monotonic()
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError) as error:
                    _send(conn, refused=f"bad request: {error}")
                    conn.close()
                    continue
                changed = changed_files(stamps)
                if changed:
                    _send(conn, refused=f"stale: {len(changed)} imported file(s) changed since warm-up, "
                                        f"e.g. {changed[0]}; this warm worker exits")
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    stop = True
                    break
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    conn.close()
                    for other in children.values():
                        other.close()
                    _become_worker(request, fds)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                _send(conn, pid=pid)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    _send(conn, exit=os.waitstatus_to_exitcode(status))
                    conn.close()
                last_active = time.monotonic()
            if not children and time.monotonic() - last_active > idle_s:
                break
    finally:
        socket_path.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        socket_path.with_suffix(".log").unlink(missing_ok=True)  # its default log (`warm_client.default_log`)
        if not os.environ.get("ROLLOUT_BENCH_RUNTIME_DIR"):  # the per-user folder in the temp folder, when empty
            try:
                socket_path.parent.rmdir()
            except OSError:
                pass
        listener.close()
        for pid, conn in children.items():  # runs still going: they are their harness's to end
            _send(conn, exit=None)
            conn.close()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        sys.stderr.write("usage: python -m bench.isolation.warm SOCKET TARGET OPTIONS_JSON IDLE_S\n")
        raise SystemExit(2)
    try:
        status = serve(Path(args[0]), args[1], json.loads(args[2]), float(args[3]))
    except Exception as error:  # noqa: BLE001 - the starting command shows it and exits 2
        print(json.dumps({"fatal": f"{type(error).__name__}: {error}"}), flush=True)
        raise SystemExit(3) from None
    raise SystemExit(status)


if __name__ == "__main__":
    main()
