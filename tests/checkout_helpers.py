"""Tests of source-only frameworks run on the checkouts a variable lists, in the framework's environment, and
skip (saying which variable and which `make` rule) when either is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def listed_checkouts(list_env: str, path_env: str) -> list[Path]:
    """The checkouts `list_env` names (separated by `:`), else the one the target's own `path_env` names."""
    return [Path(p) for p in os.environ.get(list_env, os.environ.get(path_env, "")).split(os.pathsep) if p]


def needs_checkouts(framework: str, checkouts: list[Path], python: str | None, list_env: str, path_env: str,
                    build: str) -> pytest.MarkDecorator:
    """Skip unless some checkout is listed and the framework's environment is built (`build` makes it)."""
    return pytest.mark.skipif(
        not checkouts or python is None,
        reason=f"no {framework} checkout ({list_env} or {path_env}) or no environment to run it ({build})")
