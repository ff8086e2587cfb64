"""Every request the server answered: the harness reads it in memory, reports read the table."""

from __future__ import annotations

import bisect
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from .spill import CSV_BATCH, evictable, over_window, read_chunk, write_chunk, write_csv_rows

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
    """Rows asked for were dropped from a bounded log (kept without a spill folder, or after spilling failed)."""

    def __init__(self, since: int, first_kept: int, spill_failure: str | None = None) -> None:
        why = (f"spilling them to disk failed: {spill_failure}" if spill_failure is not None else
               "the server keeps the latest rows only; give it --log-dir to keep every row on disk")
        super().__init__(f"request-log rows before seq {first_kept} were dropped from memory ({why}); asked for rows "
                         f"from {since}")
        self.since, self.first_kept = since, first_kept


class RequestLog:
    """Append-only list of `RequestRecord`s.

    Unbounded unless told (`retain`): a run's harness reads its log whole. A long-lived server (`serve`, `proxy`)
    keeps the latest `window` records in memory; older ones, once settled (answered), go to JSON Lines chunks in a
    spill folder that `rows` and `write_csv` read back, so nothing is lost, or without a folder are dropped and
    counted (`dropped`), and asking for them raises `Evicted`. Once spilling fails (a full disk), later rows are
    dropped and counted the same way (`spill_failure` says why, `dropped_from` where): rows stay bounded in memory,
    the chunks already spilled stay readable, and whole-log reads step over the dropped rows (their `seq` shows it)."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []  # in memory: rows `first_seq` onwards
        self.first_seq = 0
        self.window: int | None = None
        self.spill_dir: Path | None = None
        self.chunks: list[tuple[int, Path]] = []  # (first seq, file) of each spilled chunk, in order
        self.dropped = 0
        self.spill_failure: str | None = None  # why spilling stopped (later records are dropped then)
        self.dropped_from: int | None = None  # the first seq dropped after spilling failed (rows up to `first_seq`)

    def retain(self, window: int, spill_dir: str | Path | None = None) -> None:
        """Keep at most about `window` records in memory (settled ones beyond it spill or drop in chunks)."""
        if window < 1:
            raise ValueError(f"the request-log window must be at least 1, got {window}")
        self.window = window
        if spill_dir is not None:
            self.spill_dir = Path(spill_dir)
            self.spill_dir.mkdir(parents=True, exist_ok=True)

    def append(self, record: RequestRecord) -> None:
        records = self.records
        record.seq = self.first_seq + len(records)
        records.append(record)
        if self.window is not None and over_window(len(records), self.window):  # no call without a window
            self._evict()

    def __len__(self) -> int:
        return self.first_seq + len(self.records)

    def _evict(self) -> None:
        """Move the oldest records out of memory (`spill.evictable`: one still in flight holds them back a while), to
        a chunk on disk, or dropped and counted without a spill folder or once spilling failed."""
        assert self.window is not None
        count = evictable(self.records, self.window, _answered)
        if count == 0:
            return
        if self.spill_dir is not None and self.spill_failure is None:
            try:
                path = write_chunk(self.spill_dir, "requests", self.first_seq,
                                   (asdict(record) for record in self.records[:count]))
            except OSError as error:  # dropped from now on, as without a folder: memory stays bounded; said once
                self.spill_failure, self.dropped_from = str(error), self.first_seq
                print(f"warning: {error}; request-log rows past the window are dropped from seq {self.first_seq} on "
                      f"(counted)", file=sys.stderr, flush=True)
            else:
                self.chunks.append((self.first_seq, path))
        if self.spill_dir is None or self.spill_failure is not None:
            self.dropped += count
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
        if self._dropped_after_failure(since):
            raise Evicted(since, self.first_seq, self.spill_failure)
        return self._rows(since, len(self))

    def _dropped_after_failure(self, seq: int) -> bool:
        return self.dropped_from is not None and self.dropped_from <= seq < self.first_seq

    def _rows(self, since: int, end: int) -> Iterator[dict[str, Any]]:
        seq = since
        while seq < end:
            if self._dropped_after_failure(seq):  # counted in `dropped`; the seq of the next row shows the gap
                seq = self.first_seq
                continue
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
        """The whole log as CSV (spilled chunks included), written whole or not at all (`atomic_path`); a log that
        never spilled is written as one frame, as it always was."""
        return write_csv_rows(path, COLUMNS, self.rows(self.first_kept), batch=CSV_BATCH if self.chunks else None)

    def as_dicts(self) -> list[dict[str, Any]]:
        return list(self.rows(self.first_kept))


def _answered(record: RequestRecord) -> bool:
    return record.latency_s is not None
