"""Small synchronous HTTP helpers for server tests (plain urllib: nothing between test and bytes)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from array import array
from dataclasses import dataclass
from collections.abc import Awaitable
from typing import Any, TypeVar

from bench.replay.store import RecordedTrajectory


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[bytes]:
        """SSE payloads, after checking the framing is `data: ...\\n\\n` throughout."""
        assert self.body.endswith(b"\n\n"), self.body[-80:]
        parts = self.body[:-2].split(b"\n\n")
        assert all(p.startswith(b"data: ") for p in parts), parts
        return [p[len(b"data: "):] for p in parts]


def request(url: str, path: str, body: Any = None, *, method: str | None = None, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 30) -> Reply:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def turn_input(trajectory: RecordedTrajectory, turn: int) -> list[int]:
    """The exact input ids trajectory `trajectory` sent at `turn`."""
    recorded = trajectory.turns[turn]
    return list(array("i", trajectory.sequences[recorded.sequence][: recorded.input_len * 4]))


class ReadingProtocol:
    """What an aiohttp `StreamReader` asks of its protocol (flow control), for a body fed to a handler in process."""

    _reading_paused = False

    def pause_reading(self, **_: object) -> None:
        pass

    def resume_reading(self, **_: object) -> None:
        pass


T = TypeVar("T")


async def counting_loop_iterations(awaitable: Awaitable[T]) -> tuple[T, int]:
    """What `awaitable` gives, and how many event-loop iterations went by until it did (a callback that reschedules
    itself counts them)."""
    count, done = 0, False
    loop = asyncio.get_running_loop()

    def tick() -> None:
        nonlocal count
        count += 1
        if not done:
            loop.call_soon(tick)

    loop.call_soon(tick)
    result = await awaitable
    done = True
    return result, count
