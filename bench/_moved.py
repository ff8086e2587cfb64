"""Old import paths that keep working after the package was laid out one folder per concept.

A plug-in, notebook or conftest written against the older layout (`bench.runner`, `bench.targets.record`,
`bench.pytest_plugin`...) still imports: each old module path resolves to the module at its new home, the
very same object, with a DeprecationWarning naming where it went. `bench`, `bench.targets` use it for
names; the table below is the whole story for modules. The bench's own code never imports an old path
(`tests/test_layout.py` holds it).

Patching an old path (`mock.patch("bench.runner.run")`) patches the new module, since it is the same object;
patching a moved *name* on its old package (`bench.targets.SampleRecord`) patches only that package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any, Sequence

MOVED_MODULES: dict[str, str] = {
    "bench.attribution": "bench.records.attribution",
    "bench.targets.record": "bench.records.sample",
    "bench.server.request_log": "bench.records.request_log",
    "bench.server.served_tokens": "bench.records.served_tokens",
    "bench.fault_reach": "bench.invariants.fault_reach",
    "bench.runner": "bench.orchestration.runner",
    "bench.repro": "bench.orchestration.repro",
    "bench.known": "bench.orchestration.known",
    "bench.watchdog": "bench.orchestration.watchdog",
    "bench.hooks": "faults.hooks",
    "bench.targets.envs": "bench.targets.frameworks.envs",
    "bench.paths": "bench.trace.shipped",
    "bench.trace_stats": "bench.trace.stats",
    "bench.sweep_grid": "bench.sweep.grid",
    "bench.sweep_table": "bench.sweep.table",
    "bench.pytest_plugin": "bench.testing.pytest_plugin",
    "bench.strategies": "bench.testing.strategies",
    "bench.hypothesis_profiles": "bench.testing.hypothesis_profiles",
    "bench.explore": "bench.testing.explore",
    "bench.targets.ref_gather": "bench.targets.reference.gather",
    "bench.targets.ref_accumulator": "bench.targets.reference.accumulator",
    "bench.targets.ref_replay_buffer": "bench.targets.reference.replay_buffer",
    "bench.targets.ref_scheduler": "bench.targets.reference.scheduler",
    "bench.targets.ref_tool_loop": "bench.targets.reference.tool_loop",
    "bench.targets.slime": "bench.targets.frameworks.slime.target",
    "bench.targets.slime_family": "bench.targets.frameworks.slime.family",
    "bench.targets.slime_family_patch": "bench.targets.frameworks.slime.patch",
    "bench.targets.slime_family_plugins": "bench.targets.frameworks.slime.plugins",
    "bench.targets.miles": "bench.targets.frameworks.miles.target",
    "bench.targets.verifiers_env": "bench.targets.frameworks.verifiers.target",
    "bench.targets.verifiers_records": "bench.targets.frameworks.verifiers.records",
}


def _warn(message: str, *, skip: int = 0) -> None:
    """Warn at the line that imported: the first frame outside the import machinery and this module, after
    `skip` more (a module `__getattr__` between them)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (frame.f_code.co_filename in (__file__, "<frozen importlib._bootstrap>")
                                 or frame.f_globals.get("__name__") == "importlib"):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1  # warnings skips the frozen import machinery's frames itself; ours and importlib's count
        frame = frame.f_back
    warnings.warn(message, DeprecationWarning, stacklevel=level + skip)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the new module (the import system keeps what exec leaves)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def get_code(self, fullname: str) -> None:
        """`python -m <old path>`: say where the module went instead of a loader's AttributeError."""
        raise ImportError(f"{fullname} moved to {MOVED_MODULES[fullname]}: run that instead")

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED_MODULES[module.__name__]
        _warn(f"{module.__name__} is deprecated: it moved to {new} (the public API is `from bench import ...`)")
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    """Put the finder last on the import path, once: it answers only for names nothing else provides."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())


def moved_attribute(module: str, name: str, table: dict[str, str]) -> Any:
    """A module `__getattr__` for names that moved elsewhere: the object, with a DeprecationWarning."""
    if name not in table:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    public = f"`from bench import {name}`" if name in sys.modules["bench"].__all__ else f"{table[name]}.{name}"
    _warn(f"{module}.{name} is deprecated: use {public}", skip=1)
    value = getattr(importlib.import_module(table[name]), name)
    setattr(sys.modules[module], name, value)  # warned once: `from m import x` looks the name up twice
    return value

