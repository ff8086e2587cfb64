"""Chat-template rendering without transformers.

Uses the same Jinja settings and `tojson` filter as transformers' `apply_chat_template`,
so a prompt the bench renders is byte-identical to one real rollout code renders.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Sequence

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers replaces Jinja's HTML-escaping `tojson` with a plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def render_chat(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render `messages` (OpenAI chat format) to the prompt text the model sees."""
    return _compile(template).render(
        messages=list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt
    )
