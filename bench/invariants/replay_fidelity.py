"""Replay fidelity: the run replayed its trace, else its findings are not about the recording.

The server takes every generation request for a recorded (trajectory, turn, attempt) and logs how it
departs from the recording (`RequestRecord.drift`): `context` (the client's context left the recorded
one: its own prompt rendering, its own tool outputs, a re-tokenized reply), `extra_turn` (past the
recording's last turn) or `unknown_prompt` (no recorded prompt starts it). A drifted request is still
answered with the recorded turn its shared prefix reached, so a client that renders its own prompt is
answered turn 0 again and again: its later turns are drift at turn 0, not retries (a plain retry sends
the recorded request again and matches it). The run then goes on and is judged, but about a
conversation the trace never held.

Drift on a trajectory that a fault had already hit is the fault's doing (an oversized tool output, a
cut or aborted reply continued) and expected; it is counted apart and excused. The rest, over all
identified generation requests, is the run's drift share; above `bounds.max_drift_share` (5 %) the
run is `unfaithful`: one run-level violation naming the share and the top drift reasons.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.records.request_log import RequestRecord
from faults import FaultEvent

from .base import RunView, Violation

NAME = "replay_fidelity"
UNKNOWN = "unknown_prompt"
TOP_REASONS = 3


@dataclass(frozen=True)
class Fidelity:
    """How the run's generation requests matched the recording."""

    requests: int  # generation requests the server identified (admin routes and refused duplicates aside)
    matched: int  # exactly a recorded request: a recorded turn, or a retry of one
    drifted: int  # `context` or `extra_turn`
    unknown: int  # `unknown_prompt`
    drifted_after_fault: int  # of `drifted`: on a trajectory a fault had already hit (excused)
    reasons: list[tuple[str, int]] = field(default_factory=list)  # the counted ones, most frequent first
    examples: list[str] = field(default_factory=list)  # trajectories with counted drift, first seen first

    @property
    def off_recording(self) -> int:
        """Requests the target sent off the recording on its own: counted drift and unknown prompts."""
        return self.drifted - self.drifted_after_fault + self.unknown

    @property
    def share(self) -> float:
        return self.off_recording / self.requests if self.requests else 0.0

    def to_dict(self, max_share: float) -> dict[str, Any]:
        return {"requests": self.requests, "matched": self.matched, "drifted": self.drifted,
                "unknown": self.unknown, "drifted_after_fault": self.drifted_after_fault,
                "share": round(self.share, 6), "max_share": max_share, "unfaithful": self.share > max_share,
                "top_reasons": [{"reason": reason, "count": count} for reason, count in self.reasons[:TOP_REASONS]],
                "examples": self.examples[:5]}


def _reason(request: RequestRecord) -> str:
    return UNKNOWN if request.drift == UNKNOWN else f"{request.drift} drift at turn {request.turn}"


def measure(requests: Iterable[RequestRecord], fault_events: Iterable[FaultEvent]) -> Fidelity:
    """Count the identified generation requests by how they matched (the request log is in arrival order)."""
    first_fault: dict[str, float] = {}
    for event in fault_events:
        first_fault[event.trajectory] = min(event.time, first_fault.get(event.trajectory, event.time))
    total = matched = drifted = unknown = excused = 0
    reasons: Counter[str] = Counter()
    examples: dict[str, None] = {}
    for request in requests:
        if request.attempt is None:  # not a generation request the identifier saw
            continue
        total += 1
        if request.drift is None:
            matched += 1
            continue
        if request.drift == UNKNOWN:
            unknown += 1
        else:
            drifted += 1
            hit = first_fault.get(request.trajectory or "")
            if hit is not None and hit < request.started:  # the fault came first: it moved the conversation
                excused += 1
                continue
            examples.setdefault(request.trajectory or "", None)
        reasons[_reason(request)] += 1
    return Fidelity(total, matched, drifted, unknown, excused, reasons.most_common(), list(examples))


def describe(fidelity: dict[str, Any]) -> str:
    """One line from `Fidelity.to_dict`: the counts, the share and, when off the recording, why."""
    line = (f"{fidelity['matched']} of {fidelity['requests']} requests matched their recorded turn, "
            f"{fidelity['drifted']} drifted ({fidelity['drifted_after_fault']} after a fault), {fidelity['unknown']} "
            f"unknown: {fidelity['share']:.1%} off the recording (bound {fidelity['max_share']:.0%})")
    if fidelity["top_reasons"]:
        line += "; top drift: " + ", ".join(f"{r['reason']} x{r['count']}" for r in fidelity["top_reasons"])
    return line


def not_applicable(upstream: str) -> dict[str, Any]:
    """The summary's fidelity block of a run against a live engine: there is no recording to be faithful to."""
    return {"applies": False, "why": f"the answers came from the live engine at {upstream}, not from the "
                                     "recording: there is nothing to compare the requests with"}


def check(view: RunView) -> list[Violation]:
    if view.upstream is not None:
        return []  # does not apply: the report says so (`not_applicable`), the JUnit case is skipped
    fidelity = measure(view.requests, view.fault_events)
    bound = view.bounds.max_drift_share
    if fidelity.share <= bound:
        return []
    evidence = fidelity.to_dict(bound)
    # run-level, named after its first drifted trajectory so a repro reruns one that drifts
    return [Violation(NAME, fidelity.examples[0] if fidelity.examples else None,
                      f"unfaithful replay: {describe(evidence)}; the other findings are not about the recording",
                      evidence)]
