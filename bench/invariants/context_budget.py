"""Context budget: prompt + response fits the context length."""

from __future__ import annotations

from .base import RunView, Violation, preceding

NAME = "context_budget"


def check(view: RunView) -> list[Violation]:
    return [Violation(NAME, r.trajectory,
                      f"prompt {r.prompt_length} + response {r.response_length} tokens exceed the context of "
                      f"{view.context_length}",
                      {"prompt_length": r.prompt_length, "response_length": r.response_length,
                       "context_length": view.context_length}, preceding(view, r.trajectory))
            for r in view.records if r.prompt_length + r.response_length > view.context_length]
