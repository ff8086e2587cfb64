"""Target adapters: real rollout code (or the reference patterns) run against the bench server.

Here at the root: the adapter interface (`base`: `RolloutJob`, `TrajectorySpec`, `TargetAdapter`, `Emit`), the
registry (`registry`: names and `module:attr` plug-ins), the HTTP calls adapters share (`client`) and the hooks
faults act through (`hooks`). Below: `reference/` (one module per seed pattern, each `unfixed` and `fixed`) and
`frameworks/<name>/` (one folder per real framework: adapter, patch, plug-ins, environment, known findings).

Plug-ins and notebooks import from `bench` itself (`from bench import SampleRecord, RolloutJob, ...`).
Deprecated: `SampleRecord`, `ErrorInfo`, `OUTCOMES` and `DROPPED_OUTCOMES` from here; they live in
`bench.records` and are public as `bench.SampleRecord` etc. They still resolve, with a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any

from bench._moved import moved_attribute

from bench.records.sample import RETOKENIZED, SERVED, TOKENS_SOURCES

from .base import Emit, RolloutJob, TargetAdapter, TrajectorySpec
from .registry import (DEFAULT_TARGET, REGISTRY, TargetError, check_target_spec, framework_info_of, resolve_target,
                       tokens_source_of)

_MOVED = {name: "bench.records.sample" for name in ("SampleRecord", "ErrorInfo", "OUTCOMES", "DROPPED_OUTCOMES")}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name, _MOVED)


__all__ = ["DEFAULT_TARGET", "Emit", "REGISTRY", "RETOKENIZED", "RolloutJob", "SERVED", "TOKENS_SOURCES",
           "TargetAdapter", "TargetError", "TrajectorySpec", "check_target_spec", "framework_info_of", "resolve_target",
           "tokens_source_of"]
