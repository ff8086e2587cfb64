"""The fault log: proof that each fault fired, with the identity of the attempt it hit."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class FaultEvent:
    rule: str
    fault: str
    trajectory: str
    group: str | None
    turn: int
    attempt: int
    endpoint: str
    request_id: str
    time: float  # unix time
    change: str  # what the fault did to the answer
    # whether it reached the target's code (`bench.invariants.fault_reach`, set once the run ended): "consumed"
    # (the target acted on it), "delivered" (the client got the faulted answer; what it did with it the bench
    # cannot see), "not consumed" (it could not reach the code: the tool call was never run, the poison never read),
    # "not delivered" (the client hung up first); "" while the run goes on
    reach: str = ""

    @property
    def identity(self) -> tuple[str, str, str, int, int]:
        """Everything about the event that a rerun must reproduce (not the time or request id)."""
        return self.rule, self.fault, self.trajectory, self.turn, self.attempt


COLUMNS = [f.name for f in fields(FaultEvent)]


class FaultLog:
    def __init__(self) -> None:
        self.events: list[FaultEvent] = []

    def append(self, event: FaultEvent) -> None:
        self.events.append(event)

    def __len__(self) -> int:
        return len(self.events)

    def fired_rules(self) -> set[str]:
        return {e.rule for e in self.events}

    def never_fired(self, rule_names: Iterable[str]) -> list[str]:
        """The vacuity check: rules of the plan that no request triggered."""
        fired = self.fired_rules()
        return [name for name in rule_names if name not in fired]

    def identities(self) -> list[tuple[str, str, str, int, int]]:
        return sorted(e.identity for e in self.events)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd  # lazily: a target's worker process imports `faults` without pandas

        return pd.DataFrame([asdict(e) for e in self.events], columns=COLUMNS)

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        self.to_frame().to_csv(path, index=False)
        return path

    def as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.events]
