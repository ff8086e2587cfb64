"""Mutable server state: weight version, pause gate, requests in flight.

Abort, pause and flush act on what is in flight, so every generating request registers
here with a wake-up event that `/abort_request` and `/pause_generation` set.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution  # asyncio's loops' (another loop may not say)
_IDLE_POLL_S = 0.1  # how often a hold looks at whether anything else is still generating
VERSION_HISTORY = 4096  # weight-version changes kept (`version_at`): a long-lived server keeps the latest


class Wake:
    """What `/abort_request` and `/pause_generation` set to wake a request's pacer: an `asyncio.Event` for its one
    waiter, whose wait can also end at a deadline. A paced answer waits twice (first token, the rest): under
    `asyncio.timeout` each wait made a timeout context, a reschedulable timer and the event's own future; here it
    is one future and one timer handle."""

    __slots__ = ("_value", "_waiter")

    def __init__(self) -> None:
        self._value = False
        self._waiter: asyncio.Future[bool] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        self._value = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self, timeout: float | None = None, timers: SharedTimer | None = None) -> bool:
        """Until set (True), or `timeout` seconds passed first (False); woken in the loop iteration after either,
        as `asyncio.timeout` around `Event.wait` woke it. `timers`: the deadline goes on that shared timer (a
        server's, `ServerState.timers`) instead of a loop timer of its own."""
        if self._value:
            return True
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None
        if timeout is not None:
            if timers is None or not timers.expire(loop, loop.time() + timeout, waiter):
                timer = loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if self._waiter is waiter:
                self._waiter = None


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class SharedTimer:
    """The deadlines of a server's paced answers, on one loop timer armed for the earliest.

    Every paced answer waits twice (its first token, the rest), so a run of thousands of answers made thousands of
    loop timers: each a `TimerHandle`, pushed on and popped off the loop's heap with a Python `__lt__` per
    comparison (72,000 of them in a run of agentic-500 at time scale 0.05), then cancelled. Here a deadline is a
    tuple on a heap of its own (compared in C); the one loop timer fires at the earliest and expires every
    deadline the loop's own rule says is due (`when < now + clock resolution`, `now` read when it fires: a deadline
    due just after the iteration began may expire one iteration before its own timer would have, never before it is
    due), in deadline order. A waiter set before its deadline (an abort, a pause) or cancelled stays on
    the heap, as a cancelled loop timer stays on the loop's, until its deadline passes or it comes first on the
    heap when the timer fires."""

    __slots__ = ("_heap", "_handle", "_at", "_loop", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[bool]]] = []
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the armed loop timer fires
        self._loop: asyncio.AbstractEventLoop | None = None
        self._order = itertools.count()  # equal deadlines expire in the order they were set

    def expire(self, loop: asyncio.AbstractEventLoop, when: float, waiter: asyncio.Future[bool]) -> bool:
        """Resolve `waiter` with False at loop time `when` (unless done by then); False if this timer serves
        another loop's live deadlines (the caller then sets a timer of its own)."""
        if loop is not self._loop and not self._adopt(loop):
            return False
        heapq.heappush(self._heap, (when, next(self._order), waiter))
        if when < self._at:
            self._arm(loop, when)
        return True

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Serve `loop` from now on, unless a deadline of the loop served so far is still awaited."""
        if any(not waiter.done() for _, _, waiter in self._heap):
            return False
        if self._handle is not None:
            self._handle.cancel()
        self._heap, self._handle, self._at, self._loop = [], None, math.inf, loop
        return True

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = loop.call_at(when, self._fire), when

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        loop, heap = self._loop, self._heap
        assert loop is not None
        end = loop.time() + getattr(loop, "_clock_resolution", _CLOCK_RESOLUTION)  # the loop's own test for a timer
        while heap and (heap[0][0] < end or heap[0][2].done()):
            _expire(heapq.heappop(heap)[2])
        if heap:
            self._arm(loop, heap[0][0])


@dataclass
class InFlight:
    rid: str
    identity: Any = None  # the request's replay Identity, for fault events raised while it runs
    started: float = field(default_factory=time.monotonic)
    wake: Wake = field(default_factory=Wake)
    aborted: bool = False
    prefilled: bool = False  # past the first token: an abort returns partial output


class ServerState:
    def __init__(self, weight_version: str = "default") -> None:
        self._weight_version = weight_version
        self._version_changed = asyncio.Event()  # set, and replaced, on every change
        # (unix time, version) of every change, oldest first: which weights a moment was served (`version_at`)
        self.version_history: deque[tuple[float, str]] = deque([(time.time(), weight_version)], VERSION_HISTORY)
        self.last_generation = time.monotonic()  # when a generation last started or ended
        self.running = asyncio.Event()
        self.running.set()
        self.pause_mode: str | None = None
        self.inflight: dict[str, InFlight] = {}
        self.waiting = 0
        self.workers_available = True  # False: the router surface answers no-available-workers
        self.timers = SharedTimer()  # the paced answers' deadlines (`Pacer.sleep`)

    @property
    def weight_version(self) -> str:
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: str) -> None:
        self._weight_version = version
        self.version_history.append((time.time(), version))
        changed, self._version_changed = self._version_changed, asyncio.Event()
        changed.set()

    def version_at(self, moment: float) -> str:
        """The weight version current at unix time `moment` (the oldest one kept, for a moment before it)."""
        history = list(self.version_history)
        index = bisect.bisect_right([when for when, _ in history], moment)
        return history[max(index - 1, 0)][1]

    def idle_for(self) -> float:
        """Seconds nothing has been generating (0 while something is)."""
        return 0.0 if self.inflight else time.monotonic() - self.last_generation

    async def wait_for_version(self, at_least: int, timeout: float, idle_s: float | None = None) -> str:
        """Wait until the weight version is a number >= `at_least`: "reached"; "timeout" if `timeout` seconds
        pass first; "idle" once nothing has generated for `idle_s` (a client whose next version waits on the
        held answers themselves will never publish it)."""
        deadline = time.monotonic() + timeout
        while not (self._weight_version.isdigit() and int(self._weight_version) >= at_least):
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            if idle_s is not None and self.idle_for() >= idle_s:
                return "idle"
            try:
                await asyncio.wait_for(self._version_changed.wait(), min(left, _IDLE_POLL_S))
            except asyncio.TimeoutError:
                pass
        return "reached"

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    def busy(self) -> bool:
        return bool(self.inflight) or self.waiting > 0

    def can_flush(self, paused_flush: bool) -> bool:
        """Would the scheduler flush its cache now? When nothing runs or waits; with `paused_flush` (a build that
        allows it, `profiles.EngineBuild`) also while paused in `retract` mode (every running request went back to
        the queue) or in `in_place` mode with no request past its prefill (the queue's never ran)."""
        if not self.busy():
            return True
        if not paused_flush or not self.paused or self.pause_mode not in ("retract", "in_place"):
            return False
        return self.pause_mode == "retract" or not any(entry.prefilled for entry in self.inflight.values())

    def register(self, rid: str, identity: Any = None) -> InFlight:
        entry = InFlight(rid, identity)
        self.inflight[rid] = entry
        self.last_generation = time.monotonic()
        return entry

    def release(self, rid: str) -> None:
        self.inflight.pop(rid, None)
        self.last_generation = time.monotonic()

    def abort(self, rid_prefix: str | None = None, *, abort_all: bool = False) -> int:
        """Abort in-flight requests whose rid starts with `rid_prefix` (or all); returns how many."""
        count = 0
        for rid, entry in list(self.inflight.items()):
            if abort_all or (rid_prefix is not None and rid.startswith(rid_prefix)):
                entry.aborted = True
                entry.wake.set()
                count += 1
        return count

    def pause(self, mode: str) -> None:
        self.pause_mode = mode
        self.running.clear()
        if mode == "abort":
            self.abort(abort_all=True)
        else:
            for entry in self.inflight.values():
                entry.wake.set()

    def resume(self) -> None:
        self.pause_mode = None
        self.running.set()


class Pacer:
    """Plays one generation's timing; returns early when the request is aborted.

    While generation is paused in `retract` or `in_place` mode the clock stops and resumes
    on continue.
    """

    def __init__(self, state: ServerState, entry: InFlight) -> None:
        self._state = state
        self._entry = entry
        self.active = 0.0  # seconds of generation played so far

    def first_token(self) -> None:
        """Prefill is over: from now on an abort returns partial output."""
        self._entry.prefilled = True

    async def sleep(self, seconds: float) -> bool:
        """Advance the clock by `seconds`; False if aborted meanwhile."""
        remaining = seconds
        while True:
            if self._entry.aborted:
                return False
            if self._state.paused:
                self._entry.wake.clear()
                await self._wait_resume()
                continue
            if remaining <= 0:
                return True
            started = time.monotonic()
            self._entry.wake.clear()
            await self._entry.wake.wait(remaining, self._state.timers)  # one future; the deadline on the shared timer
            spent = time.monotonic() - started
            self.active += min(spent, remaining)
            remaining -= spent

    async def _wait_resume(self) -> None:
        resume = asyncio.ensure_future(self._state.running.wait())
        wake = asyncio.ensure_future(self._entry.wake.wait())
        try:
            await asyncio.wait({resume, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            resume.cancel()
            wake.cancel()
