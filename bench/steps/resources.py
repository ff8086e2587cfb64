"""What a worker process holds after a step: live asyncio tasks, threads, open file descriptors and sockets,
child processes, resident memory. Read from the running interpreter and `/proc` (Linux); a count the platform
cannot give is None, and the checks then say it was not measured rather than guess."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

_NAMED = 8  # at most this many of each kind are named in the evidence


def _describe_task(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    where = f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else repr(coro)
    return f"{task.get_name()}: {where}"[:200]


_TCP_STATES = {"01": "established", "02": "syn-sent", "06": "time-wait", "07": "close", "08": "close-wait",
               "0A": "listen"}


def _fds() -> tuple[int | None, list[str], list[str]]:
    """Open descriptors (None: no /proc), the socket inodes among them, and what the others point at."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None, [], []
    sockets, others = [], []
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor among them)
        if link.startswith("socket:"):
            sockets.append(link[len("socket:["):-1])
        else:
            others.append(link)
    return len(names), sockets, others


def _address(text: str) -> str:
    """`0100007F:A9C3` (IPv4, as /proc/net/tcp writes it) -> `127.0.0.1:43459`; IPv6 left in hex."""
    host, _, port = text.partition(":")
    if len(host) == 8:
        host = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return f"{host}:{int(port, 16)}"


def _socket_names(inodes: list[str]) -> list[str]:
    """What each socket is: a TCP connection's ends and state (from /proc/self/net), else `unix` or `other`."""
    tcp: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{table}") as file:
                next(file, None)
                for line in file:
                    fields = line.split()
                    if len(fields) > 9:
                        tcp[fields[9]] = (f"tcp {_address(fields[1])} -> {_address(fields[2])} "
                                          f"({_TCP_STATES.get(fields[3], fields[3])})")
        except OSError:
            continue
    return sorted(tcp.get(inode, "unix or other socket") for inode in inodes)


def _children() -> list[str] | None:
    """This process's live children (pid and command), from every thread's `children` list."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    pids: set[str] = set()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as file:
                pids.update(file.read().split())
        except OSError:
            continue
    out = []
    for pid in sorted(pids, key=int):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # ended meanwhile
        out.append(f"{pid} {command[:120]}")
    return out


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def snapshot(own_tasks: set[asyncio.Task[Any]]) -> dict[str, Any]:
    """The process now, leaving out `own_tasks` (the bench's step loop and the worker's main task)."""
    tasks = [t for t in asyncio.all_tasks() - own_tasks if not t.done()]
    threads = [t.name for t in threading.enumerate()]
    fds, sockets, files = _fds()
    children = _children()
    return {"tasks": len(tasks), "threads": len(threads), "fds": fds, "sockets": None if fds is None else len(sockets),
            "children": None if children is None else len(children), "rss_bytes": _rss_bytes(),
            "named": {"tasks": sorted(_describe_task(t) for t in tasks)[:_NAMED], "threads": sorted(threads)[:_NAMED],
                      "files": sorted(files)[-_NAMED:],
                      "sockets": [name for name in _socket_names(sockets) if name.startswith("tcp")][:_NAMED],
                      "children": (children or [])[:_NAMED]}}
