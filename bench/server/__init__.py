"""The mock SGLang / vLLM / sglang-router server (`rollout-bench serve`).

The names below load on first use (PEP 562): the command line and the worker process import the
server's light modules (profiles, the request record) without paying for aiohttp's server and pandas,
which matters when a `rollout-bench run` wants its worker started before anything else.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BenchServer": "app", "ServerThread": "app", "create_app": "app", "load_context": "app",
    "DEFAULT_PROFILE": "profiles", "PROFILES": "profiles", "get_profile": "profiles",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
