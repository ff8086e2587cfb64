"""A cache of loaded traces: a nightly run loads the same trace again and again, so the store it built (decoded,
checked, packed) is kept on disk and read back in a fraction of the load's CPU.

Never stale: an entry is keyed on the trace file's identity (resolved path, device, inode, size, mtime and ctime in
ns) and on the loader itself (a digest of the loading modules' source, msgspec's and Python's versions); anything
different is a miss and the trace is loaded and checked again. An entry is written only after a load succeeded (a
corrupt trace fails naming its line on every run, cached or not), atomically (a temporary file renamed), not for a
file modified in the last `RACY_S` seconds (an edit in the same clock tick could keep size and times: git's "racy"
rule), and not when the file changed while it was read. Each entry carries a CRC-32 of its payload (against damage,
not an adversary: whoever can write the cache folder can write the trace): a damaged entry is ignored, named in a
`TraceCacheWarning`, and rewritten by the load that follows.

Bounded: one entry per trace path (a new version replaces the old), and the least recently used entries are
removed past `ROLLOUT_BENCH_TRACE_CACHE_MB` (default 1024). `ROLLOUT_BENCH_TRACE_CACHE=off` turns it off; a folder
there puts it there (the default: `$XDG_CACHE_HOME/rollout-bench/traces`, else `~/.cache/rollout-bench/traces`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec

if TYPE_CHECKING:
    from .store import TraceStore

try:  # ISA-L's CRC-32: 1 ms for agentic-500's 17 MB entry, where zlib's takes 8 and SHA-256 15 (of a ~65 ms read)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:
    _crc32 = zlib.crc32

CACHE_ENV = "ROLLOUT_BENCH_TRACE_CACHE"
LIMIT_ENV = "ROLLOUT_BENCH_TRACE_CACHE_MB"
DEFAULT_LIMIT_MB = 1024
OFF = frozenset({"off", "0", "no", "false", "none"})
RACY_S = 2.0  # a trace modified this recently is loaded, not cached: an edit within one mtime tick keeps its key
FORMAT = 2  # this module's entry layout
MAGIC = b"rollout-bench trace cache\n"
SUFFIX = ".store"
WRITING = ".writing-"  # an entry being written; one older than ABANDONED_S was left by a process that died
ABANDONED_S = 3600.0
_LENGTH = struct.Struct("<I")


class TraceCacheWarning(UserWarning):
    """A cache entry could not be used (damaged, unreadable) or written: the trace was loaded instead."""


@dataclass(frozen=True)
class TraceCache:
    """The cache folder and its size bound, in bytes."""

    folder: Path
    limit_bytes: int

    def entry(self, resolved: Path) -> Path:
        """The one entry a trace path has (a later version of the file replaces it)."""
        return self.folder / (hashlib.sha256(str(resolved).encode()).hexdigest()[:32] + SUFFIX)


def default_cache() -> TraceCache | None:
    """The cache the environment asks for, or None when it is turned off."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() in OFF:
        return None
    if chosen:
        folder = Path(chosen).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(base) / "rollout-bench" / "traces"
    limit = os.environ.get(LIMIT_ENV, "").strip()
    try:
        limit_mb = float(limit) if limit else DEFAULT_LIMIT_MB
    except ValueError:
        raise ValueError(f"{LIMIT_ENV}={limit!r}: needs a number of MB") from None
    return TraceCache(folder, int(limit_mb * 2**20))


def file_key(path: Path) -> dict[str, Any]:
    """What identifies the trace's content without reading it, and the loader that would read it."""
    resolved = path.resolve()
    status = resolved.stat()
    return {"path": str(resolved), "device": status.st_dev, "inode": status.st_ino, "size": status.st_size,
            "mtime_ns": status.st_mtime_ns, "ctime_ns": status.st_ctime_ns, "loader": loader_version()}


@lru_cache(maxsize=1)
def loader_version() -> str:
    """A digest of everything that decides what a load builds: the loading modules' source and the libraries'
    versions. A change to any of them makes every entry a miss (no version number to forget to bump)."""
    from bench.trace import checks, reader, schema

    from . import store

    digest = hashlib.sha256(f"{FORMAT} {msgspec.__version__} {platform.python_version()}".encode())
    for module in (store, reader, checks, schema, sys.modules[__name__]):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()


def read(cache: TraceCache, path: Path, key: dict[str, Any]) -> "TraceStore | None":
    """The cached store for this key, or None (a miss: no entry, another key, or a damaged entry, warned about).
    The header is read first: an entry of another key is not read whole (hundreds of MB for a big trace)."""
    entry = cache.entry(Path(key["path"]))
    try:
        with entry.open("rb") as handle:
            header = _header(handle)
            if header.get("key") != key:
                return None  # an older version of the file, or of the loader (or of this layout): the load rewrites it
            payload = handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        _warn(f"trace cache entry {entry} is unreadable ({error}); loading {path}")
        return None
    except ValueError as error:
        _warn(f"trace cache entry {entry} is damaged ({error}); loading {path} and rewriting it")
        return None
    try:
        if _crc32(payload) != header.get("crc32"):
            raise ValueError("its checksum does not match its content")
        store = _decode(path, payload)
    except (ValueError, msgspec.MsgspecError) as error:
        _warn(f"trace cache entry {entry} is damaged ({error}); loading {path} and rewriting it")
        return None
    try:
        os.utime(entry)  # used now: the last to go when the cache is trimmed
    except OSError:
        pass
    return store


def write(cache: TraceCache, store: "TraceStore", key: dict[str, Any]) -> Path | None:
    """Keep a store that just loaded (and checked) under `key`; None when it is not kept (a file modified too
    recently or while it was read, an entry bigger than the whole cache, or a folder that cannot be written)."""
    path = Path(key["path"])
    if time.time_ns() - key["mtime_ns"] < RACY_S * 1e9 or file_key(path) != key:
        return None
    try:
        payload = _encode(store)
    except (OverflowError, TypeError, ValueError, msgspec.MsgspecError) as error:
        # a value JSON allows and the entry's encoding does not (an integer past 64 bits in sampling_params):
        # the trace loaded and is served; it is only not kept
        _warn(f"trace cache: {path} cannot be kept ({error}); it loads from the file each time")
        return None
    header = json.dumps({"key": key, "crc32": _crc32(payload)}, sort_keys=True).encode()
    size = len(MAGIC) + _LENGTH.size + len(header) + len(payload)
    if size > cache.limit_bytes:
        return None
    entry = cache.entry(path)
    try:
        cache.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=cache.folder, prefix=WRITING, suffix=SUFFIX)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(MAGIC + _LENGTH.pack(len(header)) + header)
                out.write(payload)
            os.replace(temporary, entry)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        trim(cache, keep=entry)
    except OSError as error:
        _warn(f"trace cache {cache.folder}: could not write an entry for {path} ({error})")
        return None
    return entry


def trim(cache: TraceCache, keep: Path | None = None) -> None:
    """Remove the least recently used entries until the cache fits its bound (never `keep`)."""
    entries = []
    abandoned_before = time.time_ns() - int(ABANDONED_S * 1e9)
    for entry in cache.folder.glob("*" + SUFFIX):
        try:
            status = entry.stat()
        except FileNotFoundError:
            continue  # another process trimmed it
        if entry.name.startswith(WRITING) and status.st_mtime_ns > abandoned_before:
            continue  # another process is writing it
        entries.append((status.st_mtime_ns, status.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries, key=lambda e: e[0]):
        if total <= cache.limit_bytes:
            break
        if entry != keep:
            entry.unlink(missing_ok=True)
            total -= size


def _header(handle: BinaryIO) -> dict[str, Any]:
    """An entry's header, read from its start (the payload follows); ValueError when it is not an entry."""
    prefix = handle.read(len(MAGIC) + _LENGTH.size)
    if not prefix.startswith(MAGIC) or len(prefix) < len(MAGIC) + _LENGTH.size:
        raise ValueError("it does not start as an entry does")
    (length,) = _LENGTH.unpack_from(prefix, len(MAGIC))
    raw = handle.read(length)
    if len(raw) < length:
        raise ValueError("it ends inside its header")
    try:
        header = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"its header does not parse: {error}") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not an object")
    return header


class _Payload(msgspec.Struct, array_like=True):
    header: Any  # TraceHeader (typed in `_decoder`)
    trajectories: list[Any]
    group_prompts: dict[str, bytes]  # each group's packed prompt, in the trace's order of groups


@lru_cache(maxsize=1)
def _decoder() -> msgspec.msgpack.Decoder:
    from bench.trace import TraceHeader

    from .store import RecordedTrajectory

    payload = msgspec.defstruct("Payload", [("header", TraceHeader), ("trajectories", list[RecordedTrajectory]),
                                            ("group_prompts", dict[str, bytes])], array_like=True)
    return msgspec.msgpack.Decoder(payload)


def _encode(store: "TraceStore") -> bytes:
    return msgspec.msgpack.encode(_Payload(store.header, store.trajectories,
                                           {group.id: group.prompt for group in store.groups.values()}))


def _decode(path: Path, payload: bytes) -> "TraceStore":
    from .store import Group, TraceStore

    decoded = _decoder().decode(payload)
    groups = {group_id: Group(group_id, prompt) for group_id, prompt in decoded.group_prompts.items()}
    try:
        for trajectory in decoded.trajectories:
            groups[trajectory.group_id].members.append(trajectory)
    except KeyError as error:
        raise ValueError(f"trajectory of an unknown group {error}") from None
    return TraceStore(path, decoded.header, decoded.trajectories, {t.id: t for t in decoded.trajectories}, groups)


def _warn(message: str) -> None:
    warnings.warn(message, TraceCacheWarning, stacklevel=4)
