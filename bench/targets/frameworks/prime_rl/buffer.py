"""prime-rl's `Buffer` with one change: which example the scheduler gets when it asks for a new one.

prime-rl's buffer draws examples at random, with replacement, from an endless dataset. A bench job is a finite set
of recorded groups, each to be run and reported once: a random draw would send some groups twice (their requests
counted as re-sends) and never reach others. So `sample_examples` hands out, in order:

1. each of the job's groups once, in the job's order;
2. then a group the scheduler dropped (prime-rl drops a group after `max_error_reschedule_attempts` failed rounds
   and draws a fresh example; the bench replays the dropped one instead, so its trajectories end in one record and
   its requests are counted as re-sends of the same work), at most `max_redraws` times per group (a safety valve
   for an outage that outlasts the run); a group past that is given up;
3. then a parked example (see `environment`): the next step's work, which never sends anything.

In a run of many steps each step's groups are added as it starts (`add_examples`), numbered on from the earlier
steps', in the shape prime-rl's buffer gave the first step's (`check_shape` proves the shape at the start).

Everything else is prime-rl's own: the pools, `update` (the completed groups of the step) and `sample_rollouts`.
A group is in flight while the scheduler holds its `GroupState`, finished once `update` saw it, dropped when
neither holds. When nothing is in flight and nothing is left to hand out, the batch can never fill: `exhausted`
is set, and the adapter ends the batch there.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from .environment import PARK_KEY, info_of

PARKED = -1  # the example id of a parked example


def bench_buffer_class(base: type) -> type:
    """A subclass of the checkout's `Buffer` (imported in the worker, after the placeholders are in place)."""

    class BenchBuffer(base):  # type: ignore[misc, valid-type]
        def __init__(self, envs: Any, config: Any, *, order: list[int], max_redraws: int) -> None:
            super().__init__(envs, config)
            self.order, self.max_redraws = list(order), max_redraws
            self.scheduler: Any = None  # set once the Scheduler exists: its groups say what is in flight
            self.handed: Counter[int] = Counter()  # example id -> times handed out
            self.finished: set[int] = set()
            self.given_up: list[int] = []
            self.exhausted = asyncio.Event()
            (self.env_name, env_buffer), = self.env_buffers.items()  # the bench's one environment
            self.examples: dict[int, dict[str, Any]] = dict(env_buffer.examples)

        def shaped(self, row: dict[str, Any]) -> dict[str, Any]:
            """An example as prime-rl's buffer holds it, made from a row the adapter wrote."""
            return {**self.examples[self.order[0]], **row}

        def check_shape(self, rows: list[dict[str, Any]]) -> None:
            """The first step's rows, made into examples here, are the examples prime-rl's buffer made of them:
            else a later step's examples could not be made the same way, and the run is refused."""
            for row in rows:
                made, held = self.shaped(row), self.examples.get(row["example_id"])
                if made != held:
                    raise ValueError(f"prime-rl's buffer holds example {row['example_id']} as {held!r}, not as its "
                                     f"row {made!r}: a later step's examples cannot be made the same way")

        def add_examples(self, rows: list[dict[str, Any]]) -> None:
            """A later step's groups: examples after the earlier steps' (the next example ids), handed out next."""
            for row in rows:
                self.examples[row["example_id"]] = self.shaped(row)
                self.order.append(row["example_id"])
            self.exhausted.clear()

        def in_flight(self) -> set[int]:
            """The job's groups the scheduler holds (a parked example is not one of them)."""
            return {group.example["example_id"] for group in self.scheduler.groups.values()} - {PARKED}

        def dropped(self) -> list[int]:
            """Handed out, not finished, not in flight: the scheduler let go of it."""
            flying = self.in_flight()
            return [eid for eid in self.handed if eid not in self.finished and eid not in flying
                    and eid not in self.given_up]

        def sample_examples(self, n: int) -> list[dict[str, Any]]:
            return [self._next() for _ in range(n)]

        def _next(self) -> dict[str, Any]:
            fresh = [eid for eid in self.order if eid not in self.handed]
            if fresh:
                return self._hand(fresh[0])
            for eid in self.dropped():
                if self.handed[eid] <= self.max_redraws:
                    return self._hand(eid)
                self.given_up.append(eid)
            if not self.in_flight() and len(self.finished) < len(self.order):
                self.exhausted.set()  # given-up groups: the batch can never fill
            first = self.examples[self.order[0]]
            return {**first, "example_id": PARKED, "info": json.dumps({**info_of(first), PARK_KEY: True})}

        def _hand(self, eid: int) -> dict[str, Any]:
            self.handed[eid] += 1
            return self.examples[eid]

        def update(self, rollouts: list[Any]) -> None:
            self.finished.update(rollout["example_id"] for rollout in rollouts)
            super().update(rollouts)

    return BenchBuffer
