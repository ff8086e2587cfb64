"""What one client may cost the server: body size, how long a request head or body may take to arrive, idle
connections, connections at once. A mock that a test suite or a fuzzer can wedge (a slow head held open forever, a
gigabyte body, ten thousand sockets) stops answering the rollout under test, so each has a documented, configurable
bound (`rollout-bench serve --max-body-mb ... --head-timeout ... --body-timeout ... --max-connections ...`)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Callable


SERVE_KEEP_REQUESTS = 20_000  # `serve` and `proxy`: requests kept in memory (`--keep-requests`), ~3 KB each


@dataclass(frozen=True)
class Limits:
    max_body_mb: float = 256.0  # a 4,096-prompt batch of 8k-token prompts is about 200 MB of JSON
    head_timeout_s: float = 30.0  # a request head (and an idle keep-alive connection) must arrive within this
    body_timeout_s: float = 60.0  # a body must arrive within this once its head has
    max_connections: int = 4096  # open connections at once; more are closed as they arrive
    max_n: int = 128  # samples one request may ask for (`n`); n = 100000 held the server 37 s and took 1 GB
    # requests whose log rows and served tokens stay in memory (None: all, as a run's harness reads them whole);
    # `serve` and `proxy` keep 20,000 (~3 KB each), older rows spill to --log-dir (`RequestLog.retain`)
    keep_requests: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_body_mb", "head_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number above 0, got {value!r}")
        for name in ("max_connections", "max_n", "keep_requests"):
            value = getattr(self, name)
            if value is None and name == "keep_requests":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)


class ConnectionGuard:
    """A protocol factory around aiohttp's: counts open connections and closes those past the limit as they arrive
    (the client sees the connection closed, as from a server at its accept limit). `refused` counts them."""

    def __init__(self, factory: Callable[[], Any], limit: int) -> None:
        self._factory = factory
        self.limit = limit
        self.open = 0
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Counted(self._factory(), self)


class _Counted(asyncio.Protocol):
    """Forwards every protocol call to aiohttp's handler; only counts, and refuses past the limit."""

    def __init__(self, inner: Any, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._guard.open >= self._guard.limit:
            self._guard.refused += 1
            transport.close()
            return
        self._guard.open += 1
        self._counted = True
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._guard.open -= 1
            self._counted = False
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._counted:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._counted else None

    def pause_writing(self) -> None:
        if self._counted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._counted:
            self._inner.resume_writing()
