"""Import-time placeholders for packages a framework imports but the bench's code path never calls.

Source-only frameworks (open-instruct, prime-rl) import GPU packages (vLLM, DeepSpeed, torch kernels) and
services (wandb) at module level that do not install on a CPU machine, and the bench's server plays the
engine they would drive. A `PlaceholderFinder` resolves any module of the packages it names to a
placeholder whose public attributes are empty classes, made on first use: classes, not objects, because
libraries probe them with `issubclass`. Each framework's `stubs` module says which packages and why.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

MakeAttribute = Callable[[str, str], Any]  # (module name, attribute name) -> the attribute, or NotImplemented


class _Placeholders(types.ModuleType):
    """A module whose public attributes are made on first use: by the finder's `special` hook if it has one for
    the name, else a lower-case name as a submodule (when the finder says so), else an empty class."""

    _placeholder_finder: PlaceholderFinder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        finder = self._placeholder_finder
        value = finder.special(self.__name__, name) if finder.special else NotImplemented
        if value is NotImplemented:
            if finder.lower_case_submodules and name[:1].islower():
                return importlib.import_module(f"{self.__name__}.{name}")
            value = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        value.__module__ = self.__name__  # pickled by reference as the placeholder module's (Ray ships them)
        setattr(self, name, value)
        return value


class PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every module under `packages` (top-level names) to a `_Placeholders` module."""

    def __init__(self, packages: tuple[str, ...], *, lower_case_submodules: bool = False,
                 special: MakeAttribute | None = None) -> None:
        self.packages, self.lower_case_submodules, self.special = packages, lower_case_submodules, special

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Placeholders(spec.name)
        module._placeholder_finder = self
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(finder: PlaceholderFinder) -> None:
    """Put `finder` first on the import path, once per set of packages (a second install is a no-op)."""
    if not any(isinstance(f, PlaceholderFinder) and f.packages == finder.packages for f in sys.meta_path):
        sys.meta_path.insert(0, finder)
