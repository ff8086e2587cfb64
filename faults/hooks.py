"""Hooks target adapters call so that faults injected on the wire can act in the client.

`raise_after_generate` puts `POISON_MARKER` in a valid reply; the adapter's post-processing
calls `raise_if_poisoned(text)`, which raises `InjectedFault` the way a crashing reward
function or parser would in real rollout code (seed failure mode 000).
"""

from __future__ import annotations

POISON_MARKER = "[rollout-bench:raise-after-generate]"


class InjectedFault(RuntimeError):
    """Raised by post-processing on a reply the fault engine poisoned."""


def raise_if_poisoned(text: str) -> None:
    if POISON_MARKER in text:
        raise InjectedFault(f"post-processing failed: reply carries {POISON_MARKER}")


def emit_command(size: int) -> str:
    """A shell command whose output is exactly `size` bytes (used by `oversized_tool_output`)."""
    return f"head -c {size} /dev/zero | tr '\\0' x"


# Tools that run Python source, by name -> the argument holding the source (slime's retool example registers
# `code_interpreter`). A fault that makes the model call a tool speaks the protocol of the tools the
# trajectory's prompt announces, so the call reaches the target's own tool path.
CODE_TOOLS = {"code_interpreter": "code"}


def emit_code(size: int) -> str:
    """Python source whose output is exactly `size` bytes (`x` repeated) and a newline, for a code tool."""
    return f"print('x' * {size})"


def oversized_tool_call(tool: str, size: int) -> dict[str, str]:
    """The arguments of a call to `tool` whose output is `size` bytes: code for a code tool, else a command."""
    if tool in CODE_TOOLS:
        return {CODE_TOOLS[tool]: emit_code(size)}
    return {"command": emit_command(size)}
