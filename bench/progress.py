"""Progress bars for long work, on stderr, only when someone is watching."""

from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], *, total: int | None, desc: str, enabled: bool = True) -> Iterator[T]:
    """Wrap `items` in a progress bar when `enabled` and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield from items
        return
    yield from tqdm(items, total=total, desc=desc, unit="traj", file=sys.stderr, leave=False)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(*, total: int, desc: str, enabled: bool = True) -> "tqdm | _NoBar":
    """A manual progress bar (call `update`), or a silent stand-in when nobody is watching."""
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="traj", file=sys.stderr)
