"""Bounded logs of a long-lived server: when to move rows out of memory, which may go, and where they go.

One policy for every bounded log (the request log, the fault log, the served tokens): a log keeps about `window` rows
in memory and, once it holds a quarter window more (`over_window`), lets its oldest go in one chunk, so the work is
paid once per quarter window and not on every row. A row still in flight holds the chunk back until half a window
more came after it (`evictable`).

A spilled chunk is JSON Lines, one row a line, named by its first row's number (`requests-000000020000.jsonl`),
written whole or not at all (`atomic_path`). The request log and the fault log spill their oldest rows this way and
read them back for `/bench/*` and for the CSV files written at shutdown (`write_csv_rows`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from .atomic_write import atomic_path

T = TypeVar("T")

CSV_BATCH = 10_000  # rows per DataFrame when a log is written as CSV: memory stays bounded for a log of any length


def over_window(kept: int, window: int | None) -> bool:
    """Whether a log holding `kept` rows in memory should let its oldest go (never without a window)."""
    return window is not None and kept >= window + max(1, window // 4)


def evictable(rows: Sequence[T], window: int, settled: Callable[[T], bool] | None = None) -> int:
    """How many of the oldest `rows` may leave memory: down to `window`, stopping at the first one not `settled`
    (still in flight) unless half a window more came since (it then goes as it stands). None: every row is settled."""
    most = len(rows) - window
    if settled is None:
        return max(0, most)
    stale = most - window // 2
    count = 0
    while count < most and (count < stale or settled(rows[count])):
        count += 1
    return count


def write_chunk(folder: Path, stem: str, first: int, rows: Iterable[dict[str, Any]]) -> Path:
    """Write `rows` (whose first is row number `first`) as one chunk in `folder`; a `WriteError` names the file."""
    path = folder / f"{stem}-{first:012d}.jsonl"
    with atomic_path(path) as temporary, temporary.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path


def read_chunk(path: Path) -> list[dict[str, Any]]:
    with path.open() as handle:
        return [json.loads(line) for line in handle]


def write_csv_rows(path: str | Path, columns: list[str], rows: Iterable[dict[str, Any]],
                   batch: int | None = CSV_BATCH) -> Path:
    """`rows` as CSV with `columns`, `batch` rows per DataFrame (None: one frame), whole or not at all."""
    import pandas as pd  # only reports need it: the harness and the worker start faster without

    path = Path(path)
    with atomic_path(path) as temporary, temporary.open("w", newline="") as handle:
        pending: list[dict[str, Any]] = []
        header = True
        for row in rows:
            pending.append(row)
            if batch is not None and len(pending) >= batch:
                pd.DataFrame(pending, columns=columns).to_csv(handle, index=False, header=header)
                pending, header = [], False
        pd.DataFrame(pending, columns=columns).to_csv(handle, index=False, header=header)
    return path
