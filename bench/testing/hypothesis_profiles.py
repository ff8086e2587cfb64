"""Hypothesis settings profiles for bench property tests: one for pull requests, one for nightly runs.

- `rollout-bench-pr`: derandomized (the same examples on every run, so a pull request is
  never failed by a new random draw), no example database, few examples, no deadline.
- `rollout-bench-nightly`: randomized, many examples, and an example database kept in a
  directory (`ROLLOUT_BENCH_HYPOTHESIS_DB`, default `.hypothesis/rollout-bench-nightly`) that
  the nightly job restores before and uploads after, so a failure found one night is
  replayed first the next.

Hypothesis loads its own `ci` profile when `CI` (or another CI variable) is set, replacing
whatever default a test suite expects. So the profile is chosen explicitly:
`ROLLOUT_BENCH_HYPOTHESIS_PROFILE` (`pr`, `nightly` or any registered name), else the
`bench_hypothesis_profile` ini option; the pytest plugin loads it after Hypothesis' own
choice. `--hypothesis-profile` on the command line still wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PR = "rollout-bench-pr"
NIGHTLY = "rollout-bench-nightly"
ALIASES = {"pr": PR, "nightly": NIGHTLY}
PROFILE_ENV = "ROLLOUT_BENCH_HYPOTHESIS_PROFILE"
DATABASE_ENV = "ROLLOUT_BENCH_HYPOTHESIS_DB"
DEFAULT_DATABASE = Path(".hypothesis") / "rollout-bench-nightly"


def database_dir() -> Path:
    """Where the nightly profile keeps its example database."""
    return Path(os.environ.get(DATABASE_ENV) or DEFAULT_DATABASE)


def register_profiles() -> None:
    """Register both profiles (again: the database directory is read from the environment now)."""
    quiet = [HealthCheck.too_slow]
    settings.register_profile(PR, derandomize=True, database=None, deadline=None, max_examples=30, print_blob=True,
                              suppress_health_check=quiet)
    settings.register_profile(NIGHTLY, derandomize=False, database=DirectoryBasedExampleDatabase(database_dir()),
                              deadline=None, max_examples=300, print_blob=True, suppress_health_check=quiet)


def resolve(name: str) -> str:
    """`pr` / `nightly` to the full profile name; other names pass through."""
    return ALIASES.get(name.strip(), name.strip())


def load_profile(name: str | None = None) -> str | None:
    """Register our profiles and load `name` (default: `$ROLLOUT_BENCH_HYPOTHESIS_PROFILE`); the name loaded.

    With neither, nothing is loaded and Hypothesis keeps its own choice (`default`, or `ci`).
    """
    register_profiles()
    requested = name or os.environ.get(PROFILE_ENV)
    if not requested:
        return None
    full = resolve(requested)
    try:
        settings.load_profile(full)
    except Exception as error:  # hypothesis raises InvalidArgument for unknown names
        raise ValueError(f"{PROFILE_ENV}={requested!r}: no Hypothesis profile of that name "
                         f"(ours: pr, nightly; Hypothesis': default, ci)") from error
    return full


__all__ = ["ALIASES", "DATABASE_ENV", "DEFAULT_DATABASE", "NIGHTLY", "PR", "PROFILE_ENV", "database_dir",
           "load_profile", "register_profiles", "resolve"]
