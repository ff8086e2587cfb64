"""Which trajectory an exception belongs to: known from what raised, never guessed from the fault log.

Every piece of a target's code that works for one trajectory runs in a context naming it, a
`ContextVar` the bench sets from two places:

- the server's answer: each answer carries headers naming the trajectory, turn, attempt and request id
  it served (`bench.server.served`); the worker's HTTP clients (aiohttp, httpx: the ones rollout code
  uses, the OpenAI SDK included) are patched to set the variable in the task that received the answer,
  so the code that parses and scores a reply runs named after it;
- an adapter that knows better wraps per-trajectory work in `trajectory_scope(id)`.

An HTTP error handed from the task that received it to another one (a worker queue, a trainer loop)
keeps the answer's headers: the server's identification is the fallback.

asyncio copies a task's context when it creates it, so child tasks inherit the name. Every loop's
`create_task` (patched once per process: frameworks run loops of their own on threads) keeps the task's
context and, when the task ends with an exception, stamps the trajectory it names on the exception
(once: the innermost task that raised wins). `trajectory_of(error)` then walks the exception's chain
(causes, contexts, exception groups) from the root cause outwards and returns the first stamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from asyncio import base_events
from typing import Any, Iterator

# A request header a client may send naming the trajectory it works for (reference targets and adapters do:
# identification is then exact whatever the concurrency); the answer headers name what the server served.
TRAJECTORY_HEADER = "X-Bench-Trajectory"
SERVED_TRAJECTORY_HEADER = "X-Bench-Served-Trajectory"
SERVED_TURN_HEADER = "X-Bench-Served-Turn"
SERVED_ATTEMPT_HEADER = "X-Bench-Served-Attempt"
SERVED_REQUEST_HEADER = "X-Bench-Served-Request-Id"

CURRENT_TRAJECTORY: contextvars.ContextVar[str | None] = contextvars.ContextVar("rollout_bench_trajectory",
                                                                                 default=None)
_STAMP = "__rollout_bench_trajectory__"
_PATCHED = "__rollout_bench_patched__"


@contextlib.contextmanager
def trajectory_scope(trajectory: str) -> Iterator[None]:
    """Run a block (and the tasks it creates) as working for `trajectory`."""
    token = CURRENT_TRAJECTORY.set(trajectory)
    try:
        yield
    finally:
        CURRENT_TRAJECTORY.reset(token)


def _named_in(headers: Any) -> str | None:
    """The trajectory an answer's headers name, if any (a client's odd header object names none)."""
    try:
        trajectory = headers.get(SERVED_TRAJECTORY_HEADER) if headers is not None else None
    except Exception:  # noqa: BLE001 - must never break the target
        return None
    return str(trajectory) if trajectory else None


def note_served(headers: Any) -> None:
    """An answer arrived in this task: its code now works for the trajectory the server served."""
    trajectory = _named_in(headers)
    if trajectory:
        CURRENT_TRAJECTORY.set(trajectory)


def stamp(error: BaseException, trajectory: str | None) -> None:
    """Mark `error` as raised while working for `trajectory`, unless an inner task marked it first."""
    if trajectory is None or getattr(error, _STAMP, None) is not None:
        return
    try:
        setattr(error, _STAMP, trajectory)
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass


def _chain(error: BaseException) -> list[BaseException]:
    """The exception and everything it was raised from or during, outermost first, each once."""
    out: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop(0)
        if any(current is seen for seen in out):
            continue
        out.append(current)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        pending.extend(getattr(current, "exceptions", ()) if isinstance(current, BaseExceptionGroup) else ())
    return out


def _served_in(error: BaseException) -> str | None:
    """The trajectory named by the answer an HTTP error carries (aiohttp's `headers`; httpx's and the
    OpenAI SDK's `response.headers`): the server's identification, for an error handed between tasks."""
    for holder in (error, getattr(error, "response", None)):
        trajectory = _named_in(getattr(holder, "headers", None))
        if trajectory:
            return trajectory
    return None


def trajectory_of(error: BaseException) -> str | None:
    """The trajectory whose code raised `error` (or the exception it was raised from), if the bench knows:
    the context it was raised in, else the answer it is about."""
    for link in reversed(_chain(error)):  # the root cause first: a wrapper raised elsewhere must not win
        trajectory = getattr(link, _STAMP, None) or _served_in(link)
        if trajectory is not None:
            return str(trajectory)
    return None


def _stamp_task(task: asyncio.Future[Any], context: contextvars.Context) -> None:
    # `_exception`, not `exception()`: reading it must not mark the error as retrieved (asyncio's
    # "exception was never retrieved" report is evidence of a leaked task)
    error = getattr(task, "_exception", None)
    if error is not None:
        stamp(error, context.get(CURRENT_TRAJECTORY))


def _patch_create_task() -> None:
    """Every event loop's tasks (a framework may run its own loop on a thread): each task runs in a context
    the patch keeps, so that when it ends with an exception the trajectory that context named is stamped."""
    if getattr(base_events.BaseEventLoop.create_task, _PATCHED, False):
        return
    original = base_events.BaseEventLoop.create_task

    def create_task(self: Any, coro: Any, **kwargs: Any) -> Any:
        context = kwargs.pop("context", None) or contextvars.copy_context()
        task = original(self, coro, context=context, **kwargs)
        task.add_done_callback(lambda done: _stamp_task(done, context))
        return task

    setattr(create_task, _PATCHED, True)
    base_events.BaseEventLoop.create_task = create_task  # type: ignore[method-assign]


def _patch_aiohttp() -> None:
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None or getattr(aiohttp.ClientResponse.start, _PATCHED, False):
        return
    original = aiohttp.ClientResponse.start

    async def start(self: Any, connection: Any) -> Any:
        response = await original(self, connection)
        note_served(self.headers)
        return response

    setattr(start, _PATCHED, True)
    aiohttp.ClientResponse.start = start


def _patch_httpx() -> None:
    httpx = sys.modules.get("httpx")
    if httpx is None or getattr(httpx.AsyncClient.send, _PATCHED, False):
        return
    async_send, sync_send = httpx.AsyncClient.send, httpx.Client.send

    async def send_async(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = await async_send(self, request, *args, **kwargs)
        note_served(response.headers)
        return response

    def send_sync(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = sync_send(self, request, *args, **kwargs)
        note_served(response.headers)
        return response

    for patched in (send_async, send_sync):
        setattr(patched, _PATCHED, True)
    httpx.AsyncClient.send, httpx.Client.send = send_async, send_sync


def install() -> None:
    """Name trajectories in the target's process: its HTTP clients (those already imported: call this after
    the target's imports) and the tasks of every event loop."""
    _patch_aiohttp()
    _patch_httpx()
    _patch_create_task()
