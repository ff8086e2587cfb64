"""Replay: the trace in memory, request identification, and answers adapted to requests."""

from .answer import GenerateParams, Generation, build_generation, context_error
from .identify import Identifier, Identity
from .store import TraceStore, pack

__all__ = ["GenerateParams", "Generation", "Identifier", "Identity", "TraceStore", "build_generation",
           "context_error", "pack"]
