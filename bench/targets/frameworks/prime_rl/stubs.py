"""Import-time stand-ins for the GPU and service packages prime-rl's orchestrator imports but this path never calls.

`prime_rl.utils.utils` (imported by the scheduler, the buffer and the env wrapper) imports torch, wandb and
transformers at module level; other orchestrator modules reach for vLLM, NVML, flash-attention kernels and the
Prime CLI. None of them installs on a CPU machine with Python 3.11 (or is needed: the bench's server plays the
inference engine, the scheduler's code path touches no tensor), so any module of these packages resolves to a
placeholder whose attributes are empty classes, made on first use.

They must be classes, not objects: `datasets` checks `issubclass(type(x), torch.Tensor)` (and transformers'
`PreTrainedTokenizerBase`) while hashing once it sees `torch` in `sys.modules`. `install` therefore runs after
`datasets` and `verifiers` are imported, so that their own "is torch installed?" probes see the truth.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("torch", "wandb", "transformers", "prime_cli", "pynvml", "ring_flash_attn", "liger_kernel", "vllm")


class _Placeholders(types.ModuleType):
    """A module in which every public attribute is made on first use: a lower-case name is a submodule
    (`torch.nn`, reached without importing it), any other a placeholder class (`torch.Tensor`, `nn.Module`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].islower():
            return importlib.import_module(f"{self.__name__}.{name}")
        value = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        value.__module__ = self.__name__
        setattr(self, name, value)
        return value


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Placeholders(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Put the placeholder finder first on the import path (once), after the packages that probe for torch."""
    import datasets  # noqa: F401
    import verifiers  # noqa: F401

    if not any(isinstance(finder, _PlaceholderFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PlaceholderFinder())
