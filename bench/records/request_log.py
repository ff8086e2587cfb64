"""Every request the server answered: the harness reads it in memory, reports read the table."""

from __future__ import annotations

import bisect
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from .atomic_write import atomic_path
from .spill import read_chunk, write_chunk

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)  # one per request: no per-record __dict__ (a run logs hundreds of thousands)
class RequestRecord:
    started: float  # unix time the request arrived
    endpoint: str
    rid: str | None = None
    trajectory: str | None = None
    group: str | None = None
    turn: int | None = None
    attempt: int | None = None
    drift: str | None = None
    by_order: bool = False  # identical requests of several group members: which one this was is a guess
    stream: bool = False
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: str | None = None
    latency_s: float | None = None
    client_disconnected: bool = False
    error: str | None = None
    seq: int = -1  # arrival order in the log (the row of the `requests` table)
    served_tokens: int | None = None  # output tokens served (None: not identified, so not kept)
    served_digest: str | None = None  # names the served token sequence (`served_tokens.token_digest`)
    weight_version: str | None = None  # the version the answer reported (None: none reported)
    logprobs_served: bool | None = None  # the answer carried logprobs
    continues: int | None = None  # `seq` of the request whose context this one's prompt extends


COLUMNS = [f.name for f in fields(RequestRecord)]


class Evicted(LookupError):
    """Rows asked for were dropped from a bounded log kept without a spill folder."""

    def __init__(self, since: int, first_kept: int) -> None:
        super().__init__(f"request-log rows before seq {first_kept} were dropped from memory (the server keeps the "
                         f"latest rows only; give it --log-dir to keep every row on disk); asked for rows from {since}")
        self.since, self.first_kept = since, first_kept


class RequestLog:
    """Append-only list of `RequestRecord`s.

    Unbounded unless told (`retain`): a run's harness reads its log whole. A long-lived server (`serve`, `proxy`)
    keeps the latest `window` records in memory; older ones, once settled (answered), go to JSON Lines chunks in a
    spill folder that `rows` and `write_csv` read back, so nothing is lost, or without a folder are dropped and
    counted (`dropped`), and asking for them raises `Evicted`."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []  # in memory: rows `first_seq` onwards
        self.first_seq = 0
        self.window: int | None = None
        self.spill_dir: Path | None = None
        self.chunks: list[tuple[int, Path]] = []  # (first seq, file) of each spilled chunk, in order
        self.dropped = 0
        self.spill_failure: str | None = None  # why spilling stopped (records stay in memory then)

    def retain(self, window: int, spill_dir: str | Path | None = None) -> None:
        """Keep at most about `window` records in memory (settled ones beyond it spill or drop in chunks)."""
        if window < 1:
            raise ValueError(f"the request-log window must be at least 1, got {window}")
        self.window = window
        if spill_dir is not None:
            self.spill_dir = Path(spill_dir)
            self.spill_dir.mkdir(parents=True, exist_ok=True)

    def append(self, record: RequestRecord) -> None:
        record.seq = self.first_seq + len(self.records)
        self.records.append(record)
        if self.window is not None and len(self.records) >= self.window + max(1, self.window // 4):
            self._evict(len(self.records) - self.window)

    def __len__(self) -> int:
        return self.first_seq + len(self.records)

    def _evict(self, most: int) -> None:
        """Move up to `most` of the oldest records out of memory. A record still in flight (no latency yet) stops the
        chunk, unless half a window of later records has come since (it is then written as it stands)."""
        assert self.window is not None
        stale = len(self.records) - self.window - self.window // 2
        count = 0
        while count < most and (self.records[count].latency_s is not None or count < stale):
            count += 1
        if count == 0:
            return
        chunk = self.records[:count]
        if self.spill_dir is not None and self.spill_failure is None:
            try:
                path = write_chunk(self.spill_dir, "requests", self.first_seq, (asdict(record) for record in chunk))
            except OSError as error:  # kept in memory from now on: nothing lost, said once
                self.spill_failure = str(error)
                print(f"warning: {error}; the request log stays in memory from seq {self.first_seq}",
                      file=sys.stderr, flush=True)
                return
            self.chunks.append((self.first_seq, path))
        elif self.spill_dir is None:
            self.dropped += count
        else:
            return
        del self.records[:count]
        self.first_seq += count

    @property
    def first_kept(self) -> int:
        """The oldest seq `rows` can still give (0 unless rows were dropped)."""
        return self.chunks[0][0] if self.chunks else self.first_seq

    def rows(self, since: int = 0) -> Iterator[dict[str, Any]]:
        """Every row from seq `since` to the last one logged when asked, spilled ones read back from disk chunk by
        chunk; `Evicted` if some of them were dropped. Safe to consume between awaits while the log grows and spills:
        each row is looked up where it is when its turn comes."""
        if since < self.first_kept:
            raise Evicted(since, self.first_kept)  # now, not at the first row: a generator would defer it
        return self._rows(since, len(self))

    def _rows(self, since: int, end: int) -> Iterator[dict[str, Any]]:
        seq = since
        while seq < end:
            if seq >= self.first_seq:
                yield asdict(self.records[seq - self.first_seq])
                seq += 1
                continue
            at = bisect.bisect_right([first for first, _ in self.chunks], seq) - 1
            if at < 0:  # dropped while being read (a log without a spill folder)
                raise Evicted(seq, self.first_kept)
            path, before = self.chunks[at][1], seq
            for row in read_chunk(path):
                if seq <= row["seq"] < end:
                    yield row
                    seq = row["seq"] + 1
            if seq == before:
                raise RuntimeError(f"request-log chunk {path} does not hold row {seq} (changed on disk?)")

    def to_frame(self) -> "pd.DataFrame":
        import pandas as pd  # only reports need it: the harness and the worker start faster without

        return pd.DataFrame(list(self.rows(self.first_kept)), columns=COLUMNS)

    def write_csv(self, path: str | Path) -> Path:
        """The whole log as CSV (spilled chunks included), written whole or not at all (`atomic_path`)."""
        import pandas as pd

        path = Path(path)
        with atomic_path(path) as temporary, temporary.open("w", newline="") as handle:
            if not self.chunks:
                self.to_frame().to_csv(handle, index=False)
                return path
            batch: list[dict[str, Any]] = []
            header = True
            for row in self.rows(self.first_kept):
                batch.append(row)
                if len(batch) >= 10_000:
                    pd.DataFrame(batch, columns=COLUMNS).to_csv(handle, index=False, header=header)
                    batch, header = [], False
            pd.DataFrame(batch, columns=COLUMNS).to_csv(handle, index=False, header=header)
        return path

    def as_dicts(self) -> list[dict[str, Any]]:
        return list(self.rows(self.first_kept))
