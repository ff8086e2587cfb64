"""What invariants read and what they return.

Invariants are pure functions of a `RunView` (sample records, the request log, the fault
log, what was dispatched): like a Jepsen checker they never reach into the server or the
target. Each returns `Violation`s carrying evidence and the fault event that preceded them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from faults import FaultEvent, Plan

from ..server.request_log import RequestRecord
from ..targets.record import ErrorInfo, SampleRecord


@dataclass(frozen=True)
class Bounds:
    """Per-run limits, configurable from the command line or a test."""

    max_weight_lag: int = 1  # staleness: versions behind the newest one seen
    max_requests_per_trajectory: int = 8  # retry storm above this
    max_requests_after_terminal: int = 2  # terminal errors must fail fast
    run_budget_s: float | None = None  # liveness: the whole run
    # replay fidelity: above this share of requests off the recording (drift no fault explains, unknown
    # prompts) the run is `unfaithful`
    max_drift_share: float = 0.05


@dataclass(frozen=True)
class HangReport:
    idle_s: float
    stacks: list[str]


@dataclass(frozen=True)
class RunView:
    records: list[SampleRecord]
    requests: list[RequestRecord]
    fault_events: list[FaultEvent]
    plan: Plan | None
    dispatched: dict[str, str]  # trajectory id -> group id
    context_length: int
    fail_fast: bool
    batch_error: ErrorInfo | None = None
    hang: HangReport | None = None
    duration_s: float = 0.0
    bounds: Bounds = field(default_factory=Bounds)
    emitted: dict[str, int] = field(default_factory=dict)  # records the target emitted, per trajectory

    def faults_for(self, trajectory: str) -> list[FaultEvent]:
        return [e for e in self.fault_events if e.trajectory == trajectory]


@dataclass(frozen=True)
class Violation:
    invariant: str
    trajectory: str | None
    message: str
    evidence: dict[str, Any]
    fault: dict[str, Any] | None = None  # the fault event that preceded it, when there is one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Invariant = Callable[[RunView], list[Violation]]


def preceding(view: RunView, trajectory: str | None) -> dict[str, Any] | None:
    """The last fault event on this trajectory, as evidence."""
    if trajectory is None:
        return None
    events = view.faults_for(trajectory)
    return asdict(events[-1]) if events else None
