"""Errors that name the place: file, line and field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a trace, printed as `FILE:LINE: field: message`."""

    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.message}"


class TraceFormatError(ValueError):
    """A trace file, or a record in it, does not follow the trace format."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class TraceVersionError(TraceFormatError):
    """The trace was written with a newer schema than this rollout-bench reads."""
