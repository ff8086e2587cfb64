"""Every request the server answered: the harness reads it in memory, reports read the table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


class RequestLog:
    """Append-only list of `RequestRecord`s."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        record.seq = len(self.records)
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def to_frame(self) -> "pd.DataFrame":
        import pandas as pd  # only reports need it: the harness and the worker start faster without

        return pd.DataFrame([asdict(r) for r in self.records], columns=COLUMNS)

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        self.to_frame().to_csv(path, index=False)
        return path

    def as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]
