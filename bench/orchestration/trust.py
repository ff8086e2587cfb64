"""What a repro file may make the bench run. A repro from a CI artifact names a target module and maybe an
interpreter; importing the one or starting the other runs whatever code they hold. Built-in targets, modules of the
current project (the working directory) and the bench's own environments are trusted; anything else is named on
the terminal and runs only with `--trust-plugin`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.targets.frameworks.envs import targets_dir
from bench.targets.registry import REGISTRY, _plug_in_parts, find_plug_in_package


class UntrustedRepro(ValueError):
    """The repro names code outside the project and the bench; the message says what and how to allow it."""


@dataclass(frozen=True)
class Provenance:
    """Where a repro's code comes from: `what` (for the terminal) and whether it is trusted without asking."""

    what: str
    trusted: bool


def target_provenance(spec: str, project: Path | None = None) -> Provenance:
    """A target spec's origin, found without importing it (only the top-level package is located)."""
    if spec.partition(":")[0] in REGISTRY:
        return Provenance(f"target {spec} (built in)", True)
    parts = _plug_in_parts(spec)
    if parts is None:
        return Provenance(f"target {spec} (not a target spec)", False)
    module = parts[0]
    top = module.partition(".")[0]
    root = (project or Path.cwd()).resolve()
    found, _ = find_plug_in_package(top, str(root))
    origin = _origin(found)
    if origin is None:
        return Provenance(f"target {spec}: module {module} (not found on this interpreter's path or in {root})", False)
    inside = _within(origin, root) or _within(origin, _bench_root())
    where = "the current project" if inside else "outside the current project"
    return Provenance(f"target {spec}: module {module} from {origin} ({where})", inside)


def python_provenance(python: str | None) -> Provenance | None:
    """The interpreter a repro names: trusted when it is this one or one of the bench's own environments."""
    if python is None:
        return None
    path = Path(os.path.normpath(Path(python).expanduser().absolute()))  # `..` collapsed, symlinks kept (venvs)
    ours = path.resolve() == Path(sys.executable).resolve() or _within(path, targets_dir().resolve())
    return Provenance(f"interpreter {python} ({'the bench' + chr(39) + 's' if ours else 'not one the bench built'})",
                      ours)


def check_repro(target: str | None, python: str | None, trust: bool, project: Path | None = None) -> list[str]:
    """Lines saying what the repro file makes the bench run (its target and interpreter; None: not from the file);
    `UntrustedRepro` if some of it is untrusted and `trust` is False."""
    found = [None if target is None else target_provenance(target, project), python_provenance(python)]
    named = [p for p in found if p is not None]
    untrusted = [p.what for p in named if not p.trusted]
    if untrusted and not trust:
        raise UntrustedRepro("the repro file names code from outside this project and the bench: "
                             + "; ".join(untrusted) + ". Read it, then rerun with --trust-plugin to run it "
                             "(or give --target / --python yourself)")
    return [f"repro runs {p.what}" for p in named]


def _origin(spec: object) -> Path | None:
    if spec is None:
        return None
    locations = getattr(spec, "submodule_search_locations", None)
    if locations:
        return Path(next(iter(locations))).resolve()
    origin = getattr(spec, "origin", None)
    return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _bench_root() -> Path:
    return Path(__file__).resolve().parents[2]
