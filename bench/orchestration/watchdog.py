"""The run's watchdog: what counts as progress, and when the runner stops waiting for the target.

Progress is work that finished, not traffic. It is a sample record the target emitted, or a turn of a
recorded trajectory that the server answered as recorded for the first time. The server's side has to
count because frameworks such as slime and miles emit no record until their whole rollout returns,
minutes later. Asking again for an answer already given (a retry storm, a loop on one trajectory)
adds nothing. When requests flow but nothing finishes for the watchdog's window, the run is a
**livelock**. When nothing flows either, it is a **hang**. A **deadline** ends any run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from bench.records.request_log import RequestLog, RequestRecord
from bench.replay.store import TraceStore
from bench.server.router import GENERATION_ROUTES

from .interrupt import INTERRUPTED, Interrupt

HANG, LIVELOCK, DEADLINE = "hang", "livelock", "deadline"


class ServedTurns:
    """Distinct (trajectory, turn) pairs the server answered as the trace recorded them: status 200
    without an error, or the recorded error status for a turn the trace recorded as failed.

    It reads the request log incrementally: each call looks only at requests logged since the
    previous one, plus the few logged earlier that were still unanswered. The watchdog calls it
    four times a second while the log grows to tens of thousands of requests."""

    def __init__(self, log: RequestLog, store: TraceStore) -> None:
        self._log, self._store = log, store
        self._seen = 0  # requests of the log looked at so far
        self._open: list[RequestRecord] = []  # identified requests not answered yet when looked at
        self.turns: set[tuple[str, int]] = set()
        self.generation_requests = 0  # generate / completion requests received, answered or not

    def update(self) -> tuple[int, int]:
        """Look at what the server logged since the last call: (distinct turns answered, generate requests)."""
        records = self._log.records
        new, self._seen = records[self._seen:], len(records)
        self.generation_requests += sum(1 for record in new if record.endpoint in GENERATION_ROUTES)
        still_open = []
        for record in [*self._open, *new]:
            if record.trajectory is None or record.turn is None or (record.trajectory, record.turn) in self.turns:
                continue
            if record.status is None:
                if not record.client_disconnected and record.latency_s is None:
                    still_open.append(record)  # in flight: look again next time
                continue
            self._count(record)
        self._open = still_open
        return len(self.turns), self.generation_requests

    def _count(self, record: RequestRecord) -> None:
        trajectory = self._store.by_id.get(record.trajectory or "")
        if trajectory is None or not 0 <= (record.turn or 0) < len(trajectory.turns):
            return
        recorded = trajectory.turns[record.turn or 0].error_status
        if record.status != (recorded or 200) or (recorded is None and record.error is not None):
            return
        self.turns.add((trajectory.id, record.turn or 0))


@dataclass(frozen=True)
class Stall:
    """Why the runner stopped waiting: `kind` is hang, livelock or deadline."""

    kind: str
    idle_s: float  # seconds without progress when the watchdog gave up
    requests_in_window: int  # generate requests the server received in those seconds


async def watch(task: asyncio.Task[Any], progress: Callable[[], tuple[int, int]], idle_s: float,
                deadline: float | None = None, interrupt: Interrupt | None = None) -> Stall | None:
    """Wait for the target's task; None if it ended, else the stall that ended the wait.

    `progress` returns (finished work, requests received), both only growing; `deadline` is a
    `time.monotonic()` instant that ends the run whatever it is doing; `interrupt` ends it at once."""
    (last, requests_then), changed = progress(), time.monotonic()
    interrupted = asyncio.ensure_future(interrupt.event.wait()) if interrupt is not None else None
    try:
        while not task.done():
            timeout = min(0.25, idle_s) if deadline is None else min(0.25, idle_s, deadline - time.monotonic())
            await asyncio.wait({task, *([interrupted] if interrupted else [])}, timeout=max(0.0, timeout))
            if task.done():
                break
            now, (count, requests) = time.monotonic(), progress()
            if interrupted is not None and interrupted.done():
                return Stall(INTERRUPTED, now - changed, requests - requests_then)
            stall = _stalled(now, count, requests, last, changed, requests_then, idle_s, deadline)
            if isinstance(stall, Stall):
                return stall
            last, changed, requests_then = stall
        return None
    finally:
        if interrupted is not None:
            interrupted.cancel()


def _stalled(now: float, count: int, requests: int, last: int, changed: float, requests_then: int, idle_s: float,
             deadline: float | None) -> Stall | tuple[int, float, int]:
    """The stall this moment shows, or the updated (last progress, when it changed, requests then)."""
    if count != last:
        last, changed, requests_then = count, now, requests
    if deadline is not None and now >= deadline:
        return Stall(DEADLINE, now - changed, requests - requests_then)
    if now - changed > idle_s:
        return Stall(LIVELOCK if requests > requests_then else HANG, now - changed, requests - requests_then)
    return last, changed, requests_then

