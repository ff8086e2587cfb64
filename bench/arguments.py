"""Command-line values checked before anything starts: numbers in range, output paths writable.

A bad value must fail in the first second, naming the argument, not after a whole run (a `--n 0`
that ends in "error: outcome", a `--concurrency 0` blamed on the target as a hang, an unwritable
`--junit` found once the report is due). The number checks are argparse `type=` converters, so
argparse itself prints `argument --n: ...` and exits 2; the path checks raise `ArgumentError`,
which the command line turns into exit 2 too.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable


class ArgumentError(ValueError):
    """A command-line value that cannot be used; the message starts with the argument's name."""


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= `low` (`--n`, `--concurrency`: 1; `--repro-reruns`: 0)."""
    def convert(text: str) -> int:
        value = int(_number(text, int))
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    convert.__name__ = f"integer >= {low}"
    return convert


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (`--watchdog 0` would call every run a hang at once)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (`--time-scale`: 0 replays as fast as possible)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def share(text: str) -> float:
    """A fraction in [0, 1] (`--max-drift-share`)."""
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists (what creating it would start from)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_folder(option: str, given: Path, folder: Path) -> None:
    """`folder` (the report folder, or an output file's folder) can be created or written in."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise ArgumentError(f"{option} {given}: {base} is a file, so {folder} cannot be a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ArgumentError(f"{option} {given}: {base} is not writable")
    try:  # root passes every access check; a read-only file system is found only by trying
        probe = base / f".rollout-bench-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ArgumentError(f"{option} {given}: cannot write in {base} ({error.strerror})") from None


MIN_FREE_MB_ENV = "ROLLOUT_BENCH_MIN_FREE_MB"
MIN_FREE_MB = 64.0  # a report is a few MB (its worker.log is capped at 2 MiB); 64 leaves room for a large run's tables


def check_free_space(option: str, given: Path, folder: Path) -> None:
    """The file system `folder` will be on has at least $ROLLOUT_BENCH_MIN_FREE_MB (default 64) MB free for an
    unprivileged user: a full disk is found before the run, not when its report is written (0 turns the check off)."""
    text = os.environ.get(MIN_FREE_MB_ENV, "")
    try:
        minimum = float(text) if text else MIN_FREE_MB
        if not math.isfinite(minimum) or minimum < 0:
            raise ValueError
    except ValueError:
        raise ArgumentError(f"${MIN_FREE_MB_ENV} must be a number of MB of at least 0, got {text!r}") from None
    base = _nearest_existing(folder)
    stats = os.statvfs(base)
    free_mb = stats.f_bavail * stats.f_frsize / 2**20
    if free_mb < minimum:
        raise ArgumentError(f"{option} {given}: only {free_mb:.1f} MB free on the file system of {base}; a report "
                            f"needs at least {minimum:g} MB (${MIN_FREE_MB_ENV} sets the minimum, 0 turns the check "
                            "off)")


def check_report_folder(option: str, path: str | Path, force: bool) -> Path:
    """A report folder: new, or empty, or (with `--force`) an existing folder whose files get replaced."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ArgumentError(f"{option} {folder}: exists and is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ArgumentError(f"{option} {folder}: exists and is not empty; give a new folder, or --force to write "
                            "this report into it (files of the same name are replaced)")
    _writable_folder(option, folder, folder)
    check_free_space(option, folder, folder)
    return folder


def check_output_file(option: str, path: str | Path, *, creates_folder: bool = False) -> Path:
    """A file the command will write: not a folder, in a folder that is writable; one that exists already unless the
    writer makes it (`creates_folder`: the run's --junit, beside or inside its --out, which the run creates too)."""
    file = Path(path)
    if file.is_dir():
        raise ArgumentError(f"{option} {file}: is a folder, not a file")
    if file.exists():
        if not os.access(file, os.W_OK):
            raise ArgumentError(f"{option} {file}: exists and is not writable")
        return file
    folder = file.parent
    if not creates_folder and not folder.exists():
        raise ArgumentError(f"{option} {file}: its folder {folder} does not exist")
    if folder.exists() and not folder.is_dir():
        raise ArgumentError(f"{option} {file}: {folder} is a file, not a folder")
    _writable_folder(option, file, folder)
    return file


def check_invariant_names(option: str, spec: str) -> list[str]:
    """`--invariants a,b`: each a known invariant, at least one."""
    from bench.invariants import INVARIANTS

    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in INVARIANTS]
    if unknown or not names:
        raise ArgumentError(f"{option} {spec!r}: unknown or none ({', '.join(unknown)}); "
                            f"valid: {', '.join(INVARIANTS)}")
    return names
