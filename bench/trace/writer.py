"""Trace writer: checked records, deterministic bytes, all-or-nothing files."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO, Iterable

import msgspec

from .checks import check_header, check_trajectory
from .errors import Problem, TraceFormatError
from .schema import Trajectory, TraceHeader

_encoder = msgspec.json.Encoder()


class TraceWriter:
    """Write a header and trajectories to `path` (gzip when it ends in `.gz`).

    Records are checked before they are written, the same way the reader checks them.
    The file appears under its name only when the writer closes cleanly: a failure midway
    leaves no half-written trace behind. Gzip output carries no timestamp or file name, so
    equal records give byte-identical files.
    """

    def __init__(self, path: str | Path, header: TraceHeader, *, compress: bool | None = None) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self._header = header
        self._lines_written = 0
        compress = self.path.suffix == ".gz" if compress is None else compress
        self._raw = open(self._tmp, "wb")
        self._out: IO[bytes] = (
            gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0, compresslevel=9) if compress else self._raw
        )
        for field, message in check_header(header):
            self._abort()
            raise TraceFormatError(Problem(str(self.path), 1, field, message))
        self._emit(header)

    def write(self, trajectory: Trajectory) -> None:
        line = self._lines_written + 1
        for field, message in check_trajectory(trajectory, self._header):
            raise TraceFormatError(Problem(str(self.path), line, field, message))
        self._emit(trajectory)

    def write_all(self, trajectories: Iterable[Trajectory]) -> None:
        for trajectory in trajectories:
            self.write(trajectory)

    def _emit(self, record: msgspec.Struct) -> None:
        self._out.write(_encoder.encode(record) + b"\n")
        self._lines_written += 1

    def close(self) -> None:
        self._out.close()
        self._raw.close()
        os.replace(self._tmp, self.path)

    def _abort(self) -> None:
        self._out.close()
        self._raw.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()


def write_trace(path: str | Path, header: TraceHeader, trajectories: Iterable[Trajectory]) -> Path:
    """Write a whole trace; returns its path."""
    with TraceWriter(path, header) as writer:
        writer.write_all(trajectories)
    return Path(path)
