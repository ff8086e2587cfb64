"""Normalized sample records: what every target adapter returns, whatever its framework.

Invariants and reports read only these (and the server's logs), never a framework object.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field, fields
from typing import Any

from .attribution import trajectory_of

OUTCOMES = ("completed", "truncated", "aborted", "dropped", "failed", "lost")
DROPPED_OUTCOMES = ("aborted", "dropped", "failed", "lost")

# Where an adapter's sample tokens come from (its `tokens_source`, default "served"): the server's token ids, or
# a framework that re-tokenises the text it was served (provenance then compares text).
SERVED, RETOKENIZED = "served", "retokenized"
TOKENS_SOURCES = (SERVED, RETOKENIZED)


@dataclass(frozen=True)
class ErrorInfo:
    """An exception as the code that raised it saw it: type, message, full traceback (chain included) and
    the trajectory whose code raised it, when the bench knows (`bench.records.attribution`)."""

    type: str
    message: str
    traceback: str
    trajectory: str | None = None

    @classmethod
    def of(cls, error: BaseException) -> "ErrorInfo":
        return cls(type(error).__name__, str(error),
                   "".join(traceback.format_exception(type(error), error, error.__traceback__)),
                   trajectory_of(error))

    def last_frames(self, lines: int = 8) -> str:
        """The end of the traceback: the line that failed and the message, for a terminal."""
        return "\n".join(self.traceback.rstrip().splitlines()[-lines:])


@dataclass
class SampleRecord:
    """One trajectory's result, normalized.

    `outcome`: completed, truncated, aborted (placeholder kept), dropped (by the framework's
    policy), failed (error surfaced for this trajectory), lost (never came back: the batch
    crashed or hung around it). `status` is the framework's own word for it.
    """

    trajectory: str
    group: str
    outcome: str
    status: str | None = None
    prompt_length: int = 0
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    loss_mask: list[int] = field(default_factory=list)
    response_length: int = 0
    reward: float | None = None
    weight_versions: list[str] = field(default_factory=list)
    error: ErrorInfo | None = None
    details: dict[str, Any] | None = None  # framework-specific evidence (JSON-able), e.g. a serialized error dict
    attempt: int | None = None  # which attempt at the trajectory this result is (1: the first); None: not said
    request_ids: list[str] = field(default_factory=list)  # its final attempt's requests, as the server named them
    step: int = 0  # the training step whose rollout produced it (`run --steps K`: 0 to K-1; the bench sets it)
    # unix time the rollout handed it to the trainer (`run --steps K`: the worker sets it): the weights it is
    # trained against are those current then (`bench.steps.checks.trained_against`)
    handed_over_at: float | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")

    def to_row(self) -> dict[str, Any]:
        """A flat row for the `trajectories` table: field by field, not `asdict`, whose deep copy of every token
        list (then dropped) took ~5 ms a sample on a tool loop's long responses."""
        error, details = self.error, self.details
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_IN_ROW}
        row["details"] = json.dumps(details, sort_keys=True) if details is not None else None
        row.update(error_type=error.type if error else None, error_message=error.message if error else None,
                   error_traceback=(error.traceback or None) if error else None,
                   error_raised_by=error.trajectory if error else None)
        row["request_ids"] = ",".join(self.request_ids)
        row["logprobs_count"] = None if self.logprobs is None else len(self.logprobs)
        row["loss_mask_count"] = len(self.loss_mask)
        row["response_ids_count"] = len(self.response_ids)
        row["weight_versions"] = ",".join(self.weight_versions)
        return row


# fields the row gives otherwise (counts, joined strings, the error's parts) or not at all
_NOT_IN_ROW = frozenset({"error", "details", "response_ids", "logprobs", "loss_mask", "weight_versions", "request_ids",
                         "handed_over_at"})
