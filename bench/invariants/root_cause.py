"""The root cause of a crash: what raised, and whether an injected fault reached the trajectory that raised it.

The trajectory comes from the exception itself (`ErrorInfo.trajectory`, stamped by `bench.records.attribution`
from the context the raising code ran in), never from the fault log: the fault log only answers
whether a fault reached that trajectory. A crash on a trajectory no fault reached is the target
failing on a valid reply, the worst finding of all, fail-fast policy or not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.records.sample import ErrorInfo
from faults import FaultEvent, alters_reply

from .fault_reach import NOT_REACHED


def excuses(event: FaultEvent) -> bool:
    """An injected fault that can explain a failure: it altered the reply and reached the code (`fault_reach`)."""
    return alters_reply(event.fault) and event.reach not in NOT_REACHED


@dataclass(frozen=True)
class RootCause:
    error: ErrorInfo
    trajectory: str | None  # whose code raised; None when the bench cannot tell
    fault: FaultEvent | None  # the last fault event that reached that trajectory and altered its reply

    @property
    def on_valid_reply(self) -> bool:
        """Raised by a known trajectory that no injected fault reached."""
        return self.trajectory is not None and self.fault is None

    def explain(self) -> str:
        """One sentence for messages and the terminal."""
        where = f"{self.error.type}: {self.error.message}"
        if self.trajectory is None:
            return (f"{where}; the bench could not tell which trajectory raised it (the exception carries no "
                    f"trajectory context)")
        if self.fault is None:
            return f"{where}, raised by {self.trajectory}; no injected fault reached {self.trajectory}: " \
                   f"the target failed on a valid reply"
        return (f"{where}, raised by {self.trajectory} after the injected fault {self.fault.fault} "
                f"(rule {self.fault.rule}, turn {self.fault.turn}, attempt {self.fault.attempt})")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.error.type, "message": self.error.message, "raised_by": self.trajectory,
                "fault_reached": asdict(self.fault) if self.fault else None,
                "on_valid_reply": self.on_valid_reply, "explanation": self.explain(),
                "traceback": self.error.traceback}


def root_cause(error: ErrorInfo, fault_events: list[FaultEvent]) -> RootCause:
    """Only a fault that altered the reply and reached the code excuses it: a delayed reply (latency) is still a
    valid one, and a tool call the target never ran changed nothing it saw."""
    trajectory = error.trajectory
    reached = [e for e in fault_events if e.trajectory == trajectory and excuses(e)] if trajectory else []
    return RootCause(error, trajectory, reached[-1] if reached else None)
