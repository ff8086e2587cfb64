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
