"""The fault log of a long-lived server, bounded: the latest events in memory, older ones in chunks on disk.

`serve` and `proxy` can run for days; the fault engine's log (`faults.FaultLog`) keeps every event, about one per
eight requests under the chaos plan. This subclass keeps the latest `window` events in memory and spills older ones
to JSON Lines chunks (`spill`) that every reader of the whole log reads back (`/bench/faults`, faults.csv at
shutdown); without a spill folder they are dropped and counted. Which rules fired is kept as a set, so
`never_fired` stays exact either way."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from faults.log import COLUMNS, FaultEvent, FaultLog

from .atomic_write import atomic_path
from .spill import read_chunk, write_chunk

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
        if len(self.events) >= self.window + max(1, self.window // 4):
            self._evict(len(self.events) - self.window)

    def _evict(self, count: int) -> None:
        chunk = self.events[:count]
        if self.spill_dir is None:
            self.dropped += count
        elif self.spill_failure is not None:
            return
        else:
            try:
                self.chunks.append(write_chunk(self.spill_dir, "faults", self.first, (asdict(e) for e in chunk)))
            except OSError as error:  # kept in memory from now on: nothing lost, said once
                self.spill_failure = str(error)
                print(f"warning: {error}; the fault log stays in memory from event {self.first}", file=sys.stderr,
                      flush=True)
                return
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
        import pandas as pd

        path = Path(path)
        with atomic_path(path) as temporary, temporary.open("w", newline="") as handle:
            header = True
            for path_ in list(self.chunks):
                pd.DataFrame(read_chunk(path_), columns=COLUMNS).to_csv(handle, index=False, header=header)
                header = False
            pd.DataFrame([asdict(e) for e in self.events], columns=COLUMNS).to_csv(handle, index=False, header=header)
        return path
