"""The mock SGLang / vLLM / sglang-router server (`rollout-bench serve`)."""

from .app import BenchServer, ServerThread, create_app, load_context
from .profiles import DEFAULT_PROFILE, PROFILES, get_profile

__all__ = ["BenchServer", "DEFAULT_PROFILE", "PROFILES", "ServerThread", "create_app", "get_profile", "load_context"]
