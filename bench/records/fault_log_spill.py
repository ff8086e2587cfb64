"""The fault log of a long-lived server, bounded: the latest events in memory, older ones in chunks on disk.

`serve` and `proxy` can run for days; the fault engine's log (`faults.FaultLog`) keeps every event, about one per
eight requests under the chaos plan. This subclass keeps the latest `window` events in memory and spills older ones
to JSON Lines chunks (`spill`) that every reader of the whole log reads back (`/bench/faults`, faults.csv at
shutdown); without a spill folder, or once spilling failed (`spill_failure`), they are dropped and counted. Which
rules fired is kept as a set, so `never_fired` stays exact either way."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from faults.log import COLUMNS, FaultEvent, FaultLog

from .spill import evictable, over_window, read_chunk, write_chunk, write_csv_rows

if TYPE_CHECKING:
    import pandas as pd


class SpilledFaultLog(FaultLog):
    def __init__(self, window: int, spill_dir: Path | None, events: Iterable[FaultEvent] = ()) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"the fault-log window must be at least 1, got {window}")
        self.window, self.spill_dir = window, spill_dir
        self.first = 0  # row number of events[0]
        self.chunks: list[Path] = []
        self.dropped = 0
        self.spill_failure: str | None = None
        self._fired: set[str] = set()
        for event in events:
            self.append(event)

    def append(self, event: FaultEvent) -> None:
        self.events.append(event)
        self._fired.add(event.rule)
        if over_window(len(self.events), self.window):
            self._evict(evictable(self.events, self.window))

    def _evict(self, count: int) -> None:
        if self.spill_dir is not None and self.spill_failure is None:
            try:
                self.chunks.append(write_chunk(self.spill_dir, "faults", self.first,
                                               (asdict(e) for e in self.events[:count])))
            except OSError as error:  # dropped from now on, as without a folder: memory stays bounded; said once
                self.spill_failure = str(error)
                print(f"warning: {error}; fault events past the window are dropped from event {self.first} on "
                      f"(counted)", file=sys.stderr, flush=True)
        if self.spill_dir is None or self.spill_failure is not None:
            self.dropped += count
        del self.events[:count]
        self.first += count

    def __len__(self) -> int:
        return self.first + len(self.events)

    def fired_rules(self) -> set[str]:
        return set(self._fired)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every event kept (spilled ones read back), oldest first; dropped ones are gone (`dropped`)."""
        for path in list(self.chunks):
            yield from read_chunk(path)
        for event in list(self.events):
            yield asdict(event)

    def as_dicts(self) -> list[dict[str, Any]]:
        return list(self.rows())

    def identities(self) -> list[tuple[str, str, str, int, int]]:
        return sorted((r["rule"], r["fault"], r["trajectory"], r["turn"], r["attempt"]) for r in self.rows())

    def to_frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame(self.as_dicts(), columns=COLUMNS)

    def write_csv(self, path: str | Path) -> Path:
        """The whole log (spilled chunks included) as CSV, written whole or not at all."""
        return write_csv_rows(path, COLUMNS, self.rows())
