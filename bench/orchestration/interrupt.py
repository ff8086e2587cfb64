"""A run ended early by the person or the job runner that started it (SIGINT, SIGTERM to the bench).

The command line's signal handler sets an `Interrupt`; the runner stops waiting for the target, kills
its worker (group and escapees), and returns what came back until then. The report is written and
marked `interrupted`; only violations on trajectories that came back are kept (the rest were cut off by
the signal, not by the target), and the exit status is 128 + the signal's number.
"""

from __future__ import annotations

import asyncio

INTERRUPTED = "interrupted"  # the runner's stall kind for it: not the target's doing


class Interrupt:
    """Set from a signal handler in the run's event loop; `reason` names the signal."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None  # "SIGINT", "SIGTERM"

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()

    @property
    def is_set(self) -> bool:
        return self.event.is_set()
