"""Context budget: prompt + response fits the context length, and no request asks for more than it leaves.

Two checks. A sample record whose prompt and response together exceed the context (tool
output appended untrimmed, slime#1861 (4)). A request the server refused because the input
plus its `max_new_tokens` exceed the context (no per-turn clamp to the remaining budget,
slime#1861 (2)): the server's context-length message (WIRE 1.7 and 3.2) names the numbers, and
they are compared with the run's context length, not with the one the message claims, so a
`context_length_error` fault (a server claiming a smaller context) is not the client's fault.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from bench.records.request_log import RequestRecord

from .base import RunView, Violation, preceding

NAME = "context_budget"

# (input tokens, requested output tokens) from the server's context-length texts
_ASKED = [
    re.compile(r"You requested a total of \d+ tokens: (?P<input>\d+) tokens from the input messages and "
               r"(?P<new>\d+) tokens for the completion"),  # SGLang: input + max_new_tokens > context
    re.compile(r"you requested (?P<new>\d+) output tokens and your prompt contains "
               r"(?P<input>\d+) input tokens"),  # vLLM v0.18+
    re.compile(r"The input \((?P<input>\d+) tokens\) is longer than the model's context length"),  # SGLang: input alone
]


def check(view: RunView) -> list[Violation]:
    out = [Violation(NAME, r.trajectory,
                     f"prompt {r.prompt_length} + response {r.response_length} tokens exceed the context of "
                     f"{view.context_length}",
                     {"prompt_length": r.prompt_length, "response_length": r.response_length,
                      "context_length": view.context_length}, preceding(view, r.trajectory))
           for r in view.records if r.prompt_length + r.response_length > view.context_length]
    for request in view.requests:
        asked = _asked(request.error)
        if asked is None:
            continue
        input_tokens, max_new = asked
        if input_tokens < view.context_length and input_tokens + max_new <= view.context_length:
            continue
        left = max(0, view.context_length - input_tokens)
        out.append(Violation(
            NAME, request.trajectory,
            f"turn {request.turn} (attempt {request.attempt}) asked for {input_tokens} input + {max_new} new tokens "
            f"in a context of {view.context_length} ({left} left): refused with {request.status}",
            {"turn": request.turn, "attempt": request.attempt, "input_tokens": input_tokens,
             "max_new_tokens": max_new, "requested_total": input_tokens + max_new,
             "context_length": view.context_length, "status": request.status, "error": request.error},
            _fault_before(view, request)))
    return out


def _asked(error: str | None) -> tuple[int, int] | None:
    if not error:
        return None
    for pattern in _ASKED:
        found = pattern.search(error)
        if found:
            values = found.groupdict()
            return int(values["input"]), int(values.get("new") or 0)
    return None


def _fault_before(view: RunView, request: RequestRecord) -> dict[str, Any] | None:
    """The last fault event on the request's trajectory up to the time it was answered."""
    if request.trajectory is None:
        return None
    answered = request.started + (request.latency_s or 0.0)
    events = [e for e in view.faults_for(request.trajectory) if e.time <= answered]
    return asdict(events[-1]) if events else None
