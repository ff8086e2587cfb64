"""Every request the server answered: the harness reads it in memory, reports read the table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class RequestRecord:
    started: float  # unix time the request arrived
    endpoint: str
    rid: str | None = None
    trajectory: str | None = None
    group: str | None = None
    turn: int | None = None
    attempt: int | None = None
    drift: str | None = None
    stream: bool = False
    status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: str | None = None
    latency_s: float | None = None
    client_disconnected: bool = False
    error: str | None = None


COLUMNS = [f.name for f in fields(RequestRecord)]


class RequestLog:
    """Append-only list of `RequestRecord`s."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
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
