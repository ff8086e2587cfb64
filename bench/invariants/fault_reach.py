"""Whether each fault event reached the target's code, so that only faults that could act are blamed.

A fault fired on the wire is not yet a fault the code met. An oversized tool output is a tool call
the target may never run (it only runs its own tool); a poisoned reply acts only in code that reads
the poison; an answer to a client that already hung up reaches no one. The reach of an event is:

- `consumed`: the target acted on it, as far as the bench can see (a later request carries the tool's
  output; the trajectory failed with the poison's exception);
- `delivered`: the client got the faulted answer; what its code did with it the bench cannot see
  ("delivered, effect unknown"), which for most wire faults is the whole story: a missing field was
  read or not, but it was there to be read;
- `not consumed`: it could not have acted (the tool call was never run, the poisoned reply was scored
  without reading the poison);
- `not delivered`: the client disconnected before the answer.

Drop rates by fault type count only `consumed` and `delivered` events (`bench.report.tables`).
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any

from bench.records.request_log import RequestRecord
from bench.records.sample import ErrorInfo, SampleRecord
from faults import FaultEvent, fault_class
from faults.base import FaultError

CONSUMED, DELIVERED, NOT_CONSUMED, NOT_DELIVERED = "consumed", "delivered", "not consumed", "not delivered"
NOT_REACHED = (NOT_CONSUMED, NOT_DELIVERED)  # could not have acted: no drop, no crash is put down to it
_POISON = "raise_after_generate"  # acts through the target's post-processing (`faults.hooks`)
_KEPT = ("completed", "truncated")


def _watches_later(fault: str) -> bool:
    try:
        return fault_class(fault).watches_later
    except FaultError:
        return False


def _raised_poison(error: ErrorInfo | None, trajectory: str) -> bool:
    return error is not None and "InjectedFault" in (error.type + error.traceback) and \
        error.trajectory in (None, trajectory)


def _poison_reach(event: FaultEvent, record: SampleRecord | None, batch_error: ErrorInfo | None) -> str:
    if record is not None and _raised_poison(record.error, event.trajectory):
        return CONSUMED
    if batch_error is not None and batch_error.trajectory == event.trajectory and \
            _raised_poison(batch_error, event.trajectory):
        return CONSUMED
    if record is not None and record.outcome in _KEPT:
        return NOT_CONSUMED  # scored and kept as if the reply were clean: the poison was never read
    return DELIVERED


def _shows_in_sample(event: FaultEvent, record: SampleRecord | None, tokenizer: Any) -> bool:
    """The sample the target kept carries the fault's effect (the tool's output in its response tokens)."""
    if record is None or not record.response_ids:
        return False
    fault = fault_class(event.fault).from_params({})
    return fault.consumed_in(array("i", record.response_ids).tobytes(), tokenizer)


def with_reach(events: list[FaultEvent], requests: list[RequestRecord], records: list[SampleRecord],
               batch_error: ErrorInfo | None, consumed: set[tuple[str, str, str, int, int]],
               tokenizer: Any) -> list[FaultEvent]:
    """The events, each with its `reach` set (`consumed`: the identities the server saw acted on in a later
    request; the samples are looked at too, for a trajectory that ended right after the faulted answer)."""
    disconnected = {r.rid for r in requests if r.client_disconnected and r.rid}
    by_trajectory = {r.trajectory: r for r in records}
    out = []
    for event in events:
        if event.request_id in disconnected:
            reach = NOT_DELIVERED
        elif event.fault == _POISON:
            reach = _poison_reach(event, by_trajectory.get(event.trajectory), batch_error)
        elif _watches_later(event.fault):
            acted = event.identity in consumed or _shows_in_sample(event, by_trajectory.get(event.trajectory),
                                                                   tokenizer)
            reach = CONSUMED if acted else NOT_CONSUMED
        else:
            reach = DELIVERED
        out.append(replace(event, reach=reach))
    return out
