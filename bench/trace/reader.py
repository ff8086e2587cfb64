"""Streaming trace reader and whole-file validator.

Reading never holds more than one record in memory: a trace of any size can be replayed
or validated. Errors name the file, the line and the field.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path
from typing import IO, Iterator

import msgspec

from bench.tokenizer import TOKENIZER_NAME, ByteBPETokenizer, load_tokenizer

from .checks import check_header, check_schema_version, check_tokenization, check_trajectory
from .errors import Problem, TraceFormatError, TraceVersionError
from .schema import TraceHeader, Trajectory, _HeaderProbe

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 18  # ISA-L fills whole reads: 256 kB keeps a read of a few lines, not megabytes, in memory
_LEADING_IDS = re.compile(rb'^\{"type":"trajectory","id":"([^"\\]*)","group_id":"([^"\\]*)"')
_AT_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")

try:  # ISA-L's inflate: the same gzip streams and errors, 2.7x zlib's speed here (a quarter of a cold load's CPU)
    from isal.igzip import IGzipFile as _GzipFile
    from isal.isal_zlib import error as _inflate_error

    _CORRUPT: tuple[type[BaseException], ...] = (EOFError, gzip.BadGzipFile, zlib.error, _inflate_error)
except ImportError:  # a platform without its wheel: the standard library's
    _GzipFile = gzip.GzipFile  # type: ignore[misc]
    _CORRUPT = (EOFError, gzip.BadGzipFile, zlib.error)

_header_decoder = msgspec.json.Decoder(TraceHeader)
_probe_decoder = msgspec.json.Decoder(_HeaderProbe)
_trajectory_decoder = msgspec.json.Decoder(Trajectory)


def open_binary(path: Path, *, inflate: type[gzip.GzipFile] = _GzipFile) -> IO[bytes]:
    """Open a trace for reading, gzip or plain, told apart by content, not by name (`inflate`: the gzip reader)."""
    raw = open(path, "rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic != _GZIP_MAGIC:
        return raw
    return inflate(fileobj=raw, mode="rb")


def field_and_message(error: msgspec.MsgspecError) -> tuple[str, str]:
    """Split a msgspec error into the field path it names and the message."""
    text = str(error)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return "<json>", f"not valid JSON ({text})"
    path, message = "", text
    located = _AT_PATH.match(text)
    if located:
        path, message = located["path"].lstrip("."), located["message"]
    named = _MISSING_FIELD.match(message) or _UNKNOWN_FIELD.match(message)
    if named:
        path = f"{path}.{named['name']}" if path else named["name"]
    return path or "<record>", message.replace("`", "")


class TraceReader:
    """Iterate a trace: `header` first, then `Trajectory` records, one line at a time.

    With `check=True` (the default) every record also passes the semantic checks and
    trajectory ids must be unique; the first problem raises `TraceFormatError`.
    """

    def __init__(self, path: str | Path, *, check: bool = True) -> None:
        self.path = Path(path)
        self._check = check
        self._file = open_binary(self.path)
        self._lines = self._numbered_lines()
        self._first_line_of: dict[str, int] = {}
        try:
            self.header = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> "TraceReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[Trajectory]:
        for number, line in self._lines:
            trajectory = self.decode(number, line)
            if self._check:
                for problem in self.problems(number, trajectory):
                    raise TraceFormatError(problem)
            yield trajectory

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """The remaining raw lines with their 1-based numbers; a corrupt gzip stream raises."""
        return self._lines

    def decode(self, number: int, line: bytes) -> Trajectory:
        """Decode one trajectory line against the schema (types and required fields)."""
        if not line.strip():
            self._fail(number, "<line>", "empty line (every line must be one JSON record)")
        try:
            return _trajectory_decoder.decode(line)
        except msgspec.MsgspecError as error:
            self._fail(number, *field_and_message(error))
        raise AssertionError("unreachable")

    def ids(self, number: int, line: bytes) -> tuple[str, str]:
        """(trajectory id, group id) of a raw line without decoding it when the line starts the way
        `TraceWriter` writes one (type, id, group_id); other lines are decoded."""
        head = _LEADING_IDS.search(line, 0, 512)
        if head is not None:
            return head.group(1).decode(), head.group(2).decode()
        trajectory = self.decode(number, line)
        return trajectory.id, trajectory.group_id

    def problems(self, number: int, trajectory: Trajectory, tokenizer: ByteBPETokenizer | None = None, *,
                 id_ranges: bool = True) -> list[Problem]:
        """Semantic problems of a decoded trajectory, duplicates of earlier ids included (`id_ranges=False`: all but
        the token ids' vocabulary ranges, see `check_trajectory`)."""
        issues = list(check_trajectory(trajectory, self.header, id_ranges=id_ranges))
        if tokenizer is not None and not issues:
            issues.extend(check_tokenization(trajectory, tokenizer))
        first = self._first_line_of.setdefault(trajectory.id, number)
        if first != number:
            issues.append(("id", f"duplicate trajectory id {trajectory.id!r} (first on line {first})"))
        return [Problem(str(self.path), number, field, message) for field, message in issues]

    def _fail(self, line: int, field: str, message: str, kind: type[TraceFormatError] = TraceFormatError) -> None:
        raise kind(Problem(str(self.path), line, field, message))

    def _numbered_lines(self) -> Iterator[tuple[int, bytes]]:
        number = 0
        lines = _chunked_lines(self._file) if isinstance(self._file, gzip.GzipFile) else self._file
        try:
            for number, line in enumerate(lines, start=1):
                yield number, line
        except _CORRUPT:
            # Chunks lose what their failing read had decompressed: the line-at-a-time reading, from the start,
            # fails where it always did (the lines this one lost first), and names that line. The standard library's
            # reader there: ISA-L inflates in bigger blocks and would lose the lines of the last one too.
            with open_binary(self.path, inflate=gzip.GzipFile) as again:
                try:
                    for again_number, line in enumerate(again, start=1):
                        if again_number > number:
                            number = again_number
                            yield number, line
                except _CORRUPT as error:
                    self._fail(number + 1, "<file>", f"gzip stream is corrupt or truncated ({error})")
            raise AssertionError(f"{self.path}: the gzip stream failed in chunks, not line by line")

    def _read_header(self) -> TraceHeader:
        first = next(self._lines, None)
        if first is None:
            self._fail(1, "<file>", "empty trace: the first line must be a header record")
        number, line = first  # type: ignore[misc]
        try:
            probe = _probe_decoder.decode(line)
        except msgspec.MsgspecError as error:
            self._fail(number, *field_and_message(error))
        if probe.type != "header":
            self._fail(number, "type", f"the first record must be the header (type 'header'), got {probe.type!r}")
        version_issue = check_schema_version(probe.schema_version)
        if version_issue:
            self._fail(number, *version_issue, kind=TraceVersionError)
        try:
            header = _header_decoder.decode(line)
        except msgspec.MsgspecError as error:
            self._fail(number, *field_and_message(error))
        for issue in check_header(header):
            self._fail(number, *issue)
        return header


def _chunked_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The lines of a binary stream as iterating it gives them (ends kept, split at b"\n" only), read in pieces of
    whatever one read of the compressed file gives (up to `_CHUNK`): reading a gzip stream through readline's 8 kB
    buffer costs a third as much Python as the decompression itself."""
    pending: list[bytes] = []
    while chunk := stream.read1(_CHUNK):  # type: ignore[attr-defined]
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if pending:
                pending.append(chunk[start:end + 1])
                yield b"".join(pending)
                pending = []
            else:
                yield chunk[start:end + 1]
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def open_trace(path: str | Path, *, check: bool = True) -> TraceReader:
    """Open a trace for streaming reads (use as a context manager)."""
    return TraceReader(path, check=check)


def read_header(path: str | Path) -> TraceHeader:
    with open_trace(path) as reader:
        return reader.header


def validate_trace(path: str | Path) -> Iterator[Problem]:
    """Every problem in the trace, line by line; a bad line does not stop the scan.

    Traces in the shipped tokenizer also get their texts checked against their ids.
    """
    try:
        reader = TraceReader(path, check=False)
    except TraceFormatError as error:
        yield error.problem
        return
    with reader:
        redacted = reader.header.metadata.get("text_redacted") is True  # `record --redact-text`: ids, no texts
        tokenizer = load_tokenizer() if reader.header.tokenizer.name == TOKENIZER_NAME and not redacted else None
        try:
            for number, line in reader.lines():
                try:
                    trajectory = reader.decode(number, line)
                except TraceFormatError as error:
                    yield error.problem
                    continue
                yield from reader.problems(number, trajectory, tokenizer)
        except TraceFormatError as error:  # the file itself is broken: nothing further to read
            yield error.problem
