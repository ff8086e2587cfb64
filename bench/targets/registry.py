"""The registry of targets: built-in names, plug-ins given as `module:attr`, and how each resolves.

A target is named `NAME[:VARIANT]` (`ref-gather:fixed`) or given as `module:attr` (`mymodule:Target`,
`my_pkg.targets:attr`), where `attr` is an adapter instance, or a class or factory called with the variant
(if any). Names resolve lazily: a real framework's adapter imports only in the worker that runs it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable

from bench.records.sample import SERVED, TOKENS_SOURCES

from .base import TargetAdapter

# Built-in targets: name -> "module:class", imported on first use (each is called with its variant).
REGISTRY: dict[str, str] = {
    "ref-gather": "bench.targets.reference.gather:RefGather",
    "ref-accumulator": "bench.targets.reference.accumulator:RefAccumulator",
    "ref-replay-buffer": "bench.targets.reference.replay_buffer:RefReplayBuffer",
    "ref-scheduler": "bench.targets.reference.scheduler:RefScheduler",
    "ref-tool-loop": "bench.targets.reference.tool_loop:RefToolLoop",
    "ref-step-leak": "bench.targets.reference.step_leak:RefStepLeak",  # `run --steps K`: leaks per step
    "ref-step-singleton": "bench.targets.reference.step_singleton:RefStepSingleton",  # a failed step's state stays
    "ref-step-drift": "bench.targets.reference.step_drift:RefStepDrift",  # later steps differ from a fresh process
    "ref-step-async": "bench.targets.reference.step_async:RefStepAsync",  # trains on samples of earlier steps
    "ref-step-weights": "bench.targets.reference.step_weights:RefStepWeights",  # publishes weights itself
    "verifiers": "bench.targets.frameworks.verifiers.target:VerifiersTarget",
    "miles": "bench.targets.frameworks.miles.target:MilesTarget",
    "slime": "bench.targets.frameworks.slime.target:SlimeTarget",
    "slime-retool": "bench.targets.frameworks.slime_retool.target:SlimeRetoolTarget",
    "areal": "bench.targets.frameworks.areal.target:ArealTarget",
    "verl": "bench.targets.frameworks.verl.target:VerlTarget",
    "open-instruct": "bench.targets.frameworks.open_instruct.target:OpenInstructTarget",
    "prime-rl": "bench.targets.frameworks.prime_rl.target:PrimeRlTarget",
}
DEFAULT_TARGET = "ref-gather:unfixed"
# The SGLang build a built-in target's framework runs its engines on, where that is a fork whose admin behaviour
# differs from the releases (`bench.server.profiles.ENGINES`): the bench's server plays it for that target. Known in
# the bench's process without importing the adapter (it may live in another environment). miles 0.0.2 builds its
# engines from sgl-project/sglang's `sglang-miles` branch (docker/Dockerfile) and ships that copy in its wheel.
ENGINE_OF: dict[str, str] = {"miles": "sglang-miles"}


def engine_of(spec: str) -> str | None:
    """The SGLang build target `spec` declares (`ENGINE_OF`), or None: upstream SGLang (plug-ins: by option)."""
    return ENGINE_OF.get(spec.partition(":")[0])


class TargetError(ValueError):
    """A target name or path that resolves to nothing usable."""


def _is_module(name: str) -> bool:
    """A module path a plug-in can live at (`mymodule`, `my_pkg.targets`); a built-in's name has a dash."""
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def tokens_source_of(target: Any) -> str:
    """Where a target's sample tokens come from: "served" (the server's token ids, the default) or
    "retokenized" (its framework re-tokenises the text it was served; provenance then compares text)."""
    source = getattr(target, "tokens_source", SERVED)
    if source not in TOKENS_SOURCES:
        raise TargetError(f"target {getattr(target, 'name', target)!r}: tokens_source {source!r} is not one of "
                          f"{', '.join(TOKENS_SOURCES)}")
    return str(source)


def framework_info_of(target: Any) -> dict[str, str] | None:
    """What the target says about the framework code it runs (`framework_info()`), checked: str -> str."""
    describe = getattr(target, "framework_info", None)
    if describe is None:
        return None
    info = describe()
    if info is None:
        return None
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise TargetError(f"target {getattr(target, 'name', target)!r}: framework_info() must return a mapping of "
                          f"strings, not {info!r}")
    return dict(info)


def _plug_in_parts(spec: str) -> tuple[str, str, str | None] | None:
    """`module:attr[:variant]` split, or None if `spec` is not shaped like a plug-in."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not _is_module(parts[0]) or not parts[1].isidentifier():
        return None
    if len(parts) == 3 and not parts[2]:
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _unknown(spec: str) -> TargetError:
    return TargetError(f"unknown target {spec!r}; built in (NAME[:variant]): {', '.join(REGISTRY)}; "
                       "or give module:attr[:variant]")


def check_target_spec(spec: str) -> None:
    """Fail early on a name that can never resolve, without importing the target (it may live in another venv)."""
    name = spec.partition(":")[0]
    if name in REGISTRY or _plug_in_parts(spec) is not None:
        return
    raise _unknown(spec)


def find_plug_in_package(top: str, folder: str | None = None) -> tuple[ModuleSpec | None, bool]:
    """Where a plug-in's top-level package is, found as its worker finds it, and whether only in `folder` (default:
    the working directory). A worker starts as `python -m`, which puts the working directory on its path; the
    `rollout-bench` script's path lacks it. Without importing it."""
    if top in sys.modules:
        return getattr(sys.modules[top], "__spec__", None), False
    found = importlib.util.find_spec(top)
    if found is not None:
        return found, False
    found = importlib.machinery.PathFinder.find_spec(top, [folder or os.getcwd()])
    return found, found is not None


def _import_plug_in(module_name: str) -> ModuleType:
    """The plug-in's module, found where its worker finds it (`find_plug_in_package`): an in-process run would not
    otherwise see a module the same command finds in a worker."""
    here = os.getcwd()
    _, only_here = find_plug_in_package(module_name.partition(".")[0], here)
    if only_here and here not in sys.path:
        sys.path.append(here)
    return importlib.import_module(module_name)


def _plug_in(spec: str, module_name: str, attr_name: str, variant: str | None) -> TargetAdapter:
    """A plug-in's adapter: an instance as is; a class or factory called with the variant (if one is given)."""
    try:
        module = _import_plug_in(module_name)
    except ImportError as error:
        raise TargetError(f"target {spec!r}: cannot import {module_name}: {error}") from None
    try:
        attr = getattr(module, attr_name)
    except AttributeError:
        raise TargetError(f"target {spec!r}: module {module_name} has no attribute {attr_name!r}") from None
    if isinstance(attr, type) or (callable(attr) and not hasattr(attr, "run")):
        try:
            adapter = attr() if variant is None else attr(variant)
        except (TypeError, ValueError) as error:
            called = f"{attr_name}({variant!r})" if variant is not None else f"{attr_name}()"
            raise TargetError(f"target {spec!r}: {called}: {error}") from None
    elif variant is not None:
        raise TargetError(f"target {spec!r}: {attr_name} is an adapter instance; a variant needs a class or "
                          "factory that takes it")
    else:
        adapter = attr
    if not hasattr(adapter, "run"):
        raise TargetError(f"target {spec!r}: {attr_name} has no run(job, emit) method")
    return adapter  # type: ignore[no-any-return]


def resolve_target(spec: str) -> TargetAdapter:
    """`ref-gather:fixed`, `ref-gather` (unfixed), or a plug-in `module:attr[:variant]` (`mymodule:Target`,
    `pkg.module:make_target:fixed`: a class or factory is called with the variant, or with nothing)."""
    name, _, variant = spec.partition(":")
    if name in REGISTRY:
        module_name, _, class_name = REGISTRY[name].partition(":")
        try:
            factory: Callable[[str], Any] = getattr(importlib.import_module(module_name), class_name)
            return factory(variant) if variant else factory()  # type: ignore[no-any-return]  # its default variant
        except ImportError as error:
            raise TargetError(f"target {spec!r} cannot be imported by {sys.executable}: {error} (build its "
                              "environment with `make targets`, or pass --python)") from None
        except ValueError as error:
            raise TargetError(f"target {spec!r}: {error}") from None
    parts = _plug_in_parts(spec)
    if parts is not None:
        return _plug_in(spec, *parts)
    raise _unknown(spec)
