"""Frameworks run from a source checkout (slime; open-instruct and prime-rl have no usable package): which
folder, and which commit, so a report says exactly what code it judged.

One convention for all of them: `--source DIR` on the command line (the target option `source`), else the
framework's environment variable. The commit is read from the checkout with git; a folder that is not a git
work tree (an archive, a copy) is still run, and the report says its commit is unknown.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

UNKNOWN = "unknown (not a git work tree)"


class CheckoutError(ValueError):
    """A named checkout that is not there, or not the framework's."""


@dataclass(frozen=True)
class Checkout:
    framework: str
    path: Path
    commit: str  # the full hash, or UNKNOWN
    dirty: bool | None  # uncommitted changes to tracked files; None when there is no git to ask

    def info(self) -> dict[str, str]:
        """What the report writes under `framework`."""
        commit = self.commit + (" (with uncommitted changes)" if self.dirty else "")
        return {"framework": self.framework, "source": str(self.path), "commit": commit}


def _git(path: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def read_checkout(framework: str, folder: str | os.PathLike[str], marker: str) -> Checkout:
    """The checkout at `folder`, which must hold `marker` (a file only that framework's tree has)."""
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise CheckoutError(f"{framework} source {str(folder)!r}: no such folder")
    if not (path / marker).is_file():
        raise CheckoutError(f"{framework} source {str(folder)!r}: no {marker} there (is it a {framework} checkout?)")
    found = _git(path, "rev-parse", "--show-toplevel", "HEAD^{commit}")  # fails without git or a commit
    top, _, commit = (found or "").partition("\n")
    if not commit or top != str(path):  # no repository, or the folder is only inside one
        return Checkout(framework, path, UNKNOWN, None)
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return Checkout(framework, path, commit, None if status is None else bool(status))


def named_source(options: dict[str, object], env_var: str, *aliases: str) -> str | None:
    """The checkout a run names: the `source` option (or an older alias of it), else `env_var`."""
    for key in ("source", *aliases):
        value = options.get(key)
        if value:
            return str(value)
    return os.environ.get(env_var) or None
