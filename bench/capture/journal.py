"""The recording's file: a valid trace at every moment, holding every exchange that completed.

A recording cannot know when a trajectory is over, and a recorder may be killed (SIGKILL included) at any
moment. So each finished exchange is appended at once as a *fragment*: a trajectory of its own, one line,
written with a single `write` (its prompt is the turn's whole input, so it stands alone and replays alone).
From time to time, and when the recorder stops cleanly, the file is rewritten as whole trajectories (turns
joined, fragments gone) into a temporary file renamed over the old one, so a kill never leaves a half-written
file. Rewrites happen every `COMPACT_EVERY_S` while the file is small, and otherwise when the fragments written
since the last one outweigh the joined trajectories (and at least `COMPACT_MIN_BYTES`): fragments repeat their
prompts, and this keeps the bytes written a small multiple of the trace's size. A `.gz` file is gzip at every
moment: each fragment is appended as a gzip member of its own (a file of several members is one valid stream).
"""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path
import msgspec

from bench.trace import TraceHeader, Trajectory
from bench.trace.checks import check_header, check_trajectory
from bench.trace.errors import Problem, TraceFormatError

COMPACT_MIN_BYTES = 8 * 2**20
COMPACT_EVERY_S = 10.0  # a small recording is joined this often, so a killed one is mostly whole trajectories
SMALL_BYTES = 16 * 2**20  # below this, a rewrite costs little (a tenth of a second): time alone triggers it

_encode = msgspec.json.Encoder().encode


class Journal:
    """Appends fragments to `path` and rewrites it whole on `compact` (see the module docstring)."""

    def __init__(self, path: str | Path, header: TraceHeader, *, force: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not force:
            raise FileExistsError(f"{self.path} exists; pass --force to overwrite it")
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"the folder of {self.path} does not exist; create it first")
        self.compress = self.path.suffix == ".gz"
        self.last_compaction = time.monotonic()
        for field, message in check_header(header):
            raise TraceFormatError(Problem(str(self.path), 1, field, message))
        self.header = header
        self.fragments_written = 0
        self.compactions = 0
        self._fragment_bytes = 0
        self._joined_bytes = 0
        self._fd = -1
        self._rewrite([], compress=self.compress, level=1)

    def check(self, fragment: Trajectory) -> None:
        """`TraceFormatError` for a fragment the trace could not hold (e.g. an id past the vocabulary)."""
        for field, message in check_trajectory(fragment, self.header):
            raise TraceFormatError(Problem(str(self.path), 0, field, f"fragment {fragment.id}: {message}"))

    def append(self, fragment: Trajectory) -> None:
        """One finished exchange, on disk before this returns (one `write` of one whole line); `check` it first."""
        line = _encode(fragment) + b"\n"
        os.write(self._fd, gzip.compress(line, compresslevel=1, mtime=0) if self.compress else line)
        self.fragments_written += 1
        self._fragment_bytes += len(line)

    def wants_compaction(self) -> bool:
        if not self._fragment_bytes:
            return False
        if self._joined_bytes < SMALL_BYTES and time.monotonic() - self.last_compaction >= COMPACT_EVERY_S:
            return True
        return self._fragment_bytes > max(COMPACT_MIN_BYTES, self._joined_bytes)

    def compact(self, trajectories: list[Trajectory], header: TraceHeader | None = None) -> None:
        """Replace the file by the header and these whole trajectories (every exchange so far, joined). It runs on the
        caller's thread: the proxy stalls for its length (a tenth of a second below `SMALL_BYTES`)."""
        self.header = header or self.header
        self._rewrite(trajectories, compress=self.compress, level=1)
        self.compactions += 1

    def close(self, trajectories: list[Trajectory], header: TraceHeader | None = None) -> None:
        """The clean end: the whole trajectories, compressed when the name ends in `.gz`."""
        self.header = header or self.header
        for number, trajectory in enumerate(trajectories, start=2):
            for field, message in check_trajectory(trajectory, self.header):
                raise TraceFormatError(Problem(str(self.path), number, field, message))
        self._rewrite(trajectories, compress=self.compress)
        os.close(self._fd)
        self._fd = -1

    def discard(self) -> None:
        """Remove the file: the recording never started (e.g. its port was taken)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)

    def _rewrite(self, trajectories: list[Trajectory], *, compress: bool = False, level: int = 9) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self.last_compaction = time.monotonic()
        with open(temporary, "wb") as raw:
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=level) if compress else raw
            out.write(_encode(self.header) + b"\n")
            joined = 0
            for trajectory in trajectories:
                line = _encode(trajectory) + b"\n"
                out.write(line)
                joined += len(line)
            if compress:
                out.close()
        os.replace(temporary, self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._joined_bytes, self._fragment_bytes = joined, 0
