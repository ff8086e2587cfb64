"""Where shipped data lives, in a checkout and in an installed wheel alike.

`traces/` sits at the top of the repository (it is not an import package); the wheel
carries it as `bench/_shipped/traces`. Every lookup tries the installed location first.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # the `bench` package

SHIPPED_TRACES = {
    # name: (file, kind, n, seed) -- `make traces` regenerates them with these arguments
    "rlvr-500": ("rlvr-500.jsonl.gz", "rlvr", 500, 1),
    "agentic-500": ("agentic-500.jsonl.gz", "agentic", 500, 1),
    "retool-64": ("retool-64.jsonl.gz", "retool", 64, 1),
}
DEFAULT_TRACE = "agentic-500"


def traces_dir() -> Path:
    """The folder of shipped traces."""
    installed = _PACKAGE / "_shipped" / "traces"
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent / "traces"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"no shipped traces: neither {installed} nor {checkout} exists")


def shipped_trace(name: str) -> Path:
    """Path of a shipped trace by name (e.g. `agentic-500`)."""
    if name not in SHIPPED_TRACES:
        raise KeyError(f"no shipped trace named {name!r}; shipped: {', '.join(sorted(SHIPPED_TRACES))}")
    return traces_dir() / SHIPPED_TRACES[name][0]


def resolve_trace(spec: str) -> Path:
    """A trace argument: an existing file path, or the name of a shipped trace."""
    path = Path(spec)
    if path.exists():
        return path
    if spec in SHIPPED_TRACES:
        return shipped_trace(spec)
    raise FileNotFoundError(
        f"trace {spec!r}: no such file, and not a shipped trace name ({', '.join(sorted(SHIPPED_TRACES))})"
    )
