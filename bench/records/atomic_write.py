"""Files written whole or not at all: a writer fills a temporary file beside the destination, which is renamed into
place only once it is complete (a rename within one folder is atomic). A full disk or a size limit mid-way then leaves
the old file (or none) and no half-written one, and the error names the file it was writing."""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_FULL = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "file too large (a size limit)",
         errno.EDQUOT: "disk quota exceeded"}


class WriteError(OSError):
    """Writing an output file failed; the message names the file and why (the original error is its cause)."""


def describe(error: OSError, path: Path) -> str:
    """`cannot write PATH: no space left on the device` (or the system's own words for other errors)."""
    reason = _FULL.get(error.errno or 0) or error.strerror or str(error)
    return f"cannot write {path}: {reason}"


def write_text(path: str | Path, text: str) -> Path:
    """`Path.write_text` (UTF-8), whole or not at all."""
    path = Path(path)
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed to `path` when the block ends without an error, removed
    when it raises. An OSError (ENOSPC, EFBIG, EACCES ...) comes out as a `WriteError` naming `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")  # the suffix kept: writers go by it
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException as error:
        try:
            temporary.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # the folder itself went away or became unwritable: nothing more to clean
            pass
        if isinstance(error, OSError) and not isinstance(error, WriteError):
            failure = WriteError(describe(error, path))
            failure.errno = error.errno
            raise failure from error
        raise
