"""What invariants read and what they return.

Invariants are pure functions of a `RunView` (sample records, the request log, the fault
log, what was dispatched): like a Jepsen checker they never reach into the server or the
target. Each returns `Violation`s carrying evidence and the fault event that preceded them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from bench.records.request_log import RequestRecord
from bench.records.sample import ErrorInfo, SampleRecord
from bench.records.served_tokens import ServedTokens
from faults import FaultEvent, Plan


@dataclass(frozen=True)
class Bounds:
    """Per-run limits, configurable from the command line or a test."""

    max_weight_lag: int = 1  # staleness: versions behind the newest one seen
    max_requests_per_trajectory: int = 8  # retry storm above this
    max_requests_after_terminal: int = 2  # terminal errors must fail fast
    # batch churn: re-sends per turn of a finished sample, beyond one group's worth of the per-trajectory
    # bound (retry_discipline); a correct framework retrying transient faults stays far below it
    max_resends_per_finished_turn: float = 4.0
    run_budget_s: float | None = None  # liveness: the whole run
    # replay fidelity: above this share of requests off the recording (drift no fault explains, unknown
    # prompts) the run is `unfaithful`
    max_drift_share: float = 0.05


@dataclass(frozen=True)
class HangReport:
    """Why the runner stopped waiting for the target, with every stack it could collect."""

    idle_s: float  # the watchdog's window (hang, livelock) or the seconds since the last progress (deadline)
    stacks: list[str]
    kind: str = "hang"  # hang: nothing flowed; livelock: requests flowed, nothing finished; deadline: out of time
    requests_in_window: int = 0  # generate requests the server received while nothing finished
    window_s: float = 0.0  # how long that was
    deadline_s: float | None = None  # the run's deadline, when it is what ended the run


_FAULTS_BY_TRAJECTORY = "fault events by trajectory"


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
    served: ServedTokens | None = None  # what each identified request was served, token by token
    tokens_source: str = "served"  # "retokenized": the target's framework re-tokenises the text it was served
    decode: Callable[[list[int]], str] | None = None  # the trace's tokenizer, for text comparisons
    upstream: str | None = None  # answers came from this live engine (through the proxy), not from the recording
    # what a check worked out once, for others that read it too (the runner's per-sample provenance verdicts)
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def faults_for(self, trajectory: str) -> list[FaultEvent]:
        """The trajectory's fault events, in log order. Indexed once per view: a scan of the whole log per
        record made checks that ask for every record quadratic (records x events)."""
        key = (id(self.fault_events), len(self.fault_events))
        index = self.memo.get(_FAULTS_BY_TRAJECTORY)
        if index is None or index[0] != key:
            by_trajectory: dict[str, list[FaultEvent]] = {}
            for event in self.fault_events:
                by_trajectory.setdefault(event.trajectory, []).append(event)
            index = self.memo[_FAULTS_BY_TRAJECTORY] = (key, by_trajectory)
        return list(index[1].get(trajectory, ()))

    def final_attempt_faults(self, record: SampleRecord) -> list[FaultEvent]:
        """The fault events behind what a record holds: those of its final attempt's requests when the target
        names them (a retried sample is judged on the attempt it kept), else all of its trajectory's."""
        events = self.faults_for(record.trajectory)
        if not record.request_ids:
            return events
        kept = set(record.request_ids)
        return [e for e in events if e.request_id in kept]


@dataclass(frozen=True)
class Violation:
    invariant: str
    trajectory: str | None
    message: str
    evidence: dict[str, Any]
    fault: dict[str, Any] | None = None  # the fault event that preceded it, when there is one
    occurrences: int = 1  # how many times the check found it on this trajectory (one per request, say)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Invariant = Callable[[RunView], list[Violation]]


def preceding(view: RunView, trajectory: str | None, record: SampleRecord | None = None) -> dict[str, Any] | None:
    """The last fault event on this trajectory (on the record's final attempt, given a record), as evidence."""
    if trajectory is None:
        return None
    events = view.final_attempt_faults(record) if record is not None else view.faults_for(trajectory)
    return asdict(events[-1]) if events else None
