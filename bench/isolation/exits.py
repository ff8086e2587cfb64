"""A rollout that calls `sys.exit()` crashed the batch with `SystemExit` and its code.

asyncio does not treat SystemExit as a task's result: it lets it out of the event loop, which then
cancels everything, so the run reported a `CancelledError` instead of what happened. The rollout is
awaited through `exits_as_errors`, which turns it into an ordinary exception of the target's task,
reported under the name `SystemExit` (`error_info`).
"""

from __future__ import annotations

import dataclasses
import linecache
from typing import Any, TextIO

from bench.records.sample import ErrorInfo


class TargetExited(Exception):
    """The rollout called `sys.exit(code)`; its `__cause__` is the SystemExit."""


async def exits_as_errors(rollout: Any) -> Any:
    try:
        return await rollout
    except SystemExit as error:
        raise TargetExited(f"the rollout called sys.exit({error.code!r})") from error


def error_info(error: BaseException) -> ErrorInfo:
    """`ErrorInfo.of`, naming a rollout's sys.exit `SystemExit`."""
    info = ErrorInfo.of(error)
    if isinstance(error, TargetExited) and isinstance(error.__cause__, SystemExit):
        info = dataclasses.replace(info, type="SystemExit")
    return info


def print_awaited(coro: Any, out: TextIO) -> None:
    """The coroutines a task's coroutine awaits, innermost last: `Task.print_stack` shows only the outermost
    frame, which for the target's task is `exits_as_errors`, not the rollout's code."""
    inner = getattr(coro, "cr_await", None)
    while inner is not None and getattr(inner, "cr_frame", None) is not None:
        frame = inner.cr_frame
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        out.write(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_qualname}\n'
                  + (f"    {line}\n" if line else ""))
        inner = getattr(inner, "cr_await", None)
