"""Import-time stand-ins for the two GPU packages open-instruct imports but this path never calls.

`vllm_utils` imports some fifteen names from vLLM (engine, server, KV-cache classes) and `data_loader` pulls in
DeepSpeed through the trainer utilities. Neither installs on a CPU machine, and the bench's server plays the
vLLM engine, so any `vllm.*` / `deepspeed.*` module resolves to a placeholder whose attributes are empty
classes. One exception: `vllm_utils` edits `MambaSpec.__dataclass_fields__["dtypes"]` at import, so that one
is a dataclass with such a field.

Ray's queue actors unpickle open-instruct objects (`PromptRequest` holds a `SamplingConfig`), so they need the
stand-ins as well: `install` is also their `worker_process_setup_hook`.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("vllm", "deepspeed")


class _Placeholders(types.ModuleType):
    """A module in which every public attribute is a placeholder class, made on first use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "MambaSpec":
            value: type = dataclasses.make_dataclass(name, [("dtypes", tuple, ())])
        else:
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
    """Put the placeholder finder first on the import path (once)."""
    if not any(isinstance(finder, _PlaceholderFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PlaceholderFinder())
