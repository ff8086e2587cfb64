"""Chunks of log rows on disk, for a long-lived server whose logs must not grow in memory without bound.

A chunk is JSON Lines, one row a line, named by its first row's number (`requests-000000020000.jsonl`), written whole
or not at all (`atomic_path`). The request log and the fault log spill their oldest rows this way and read them back
for `/bench/*` and for the CSV files written at shutdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from .atomic_write import atomic_path


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
