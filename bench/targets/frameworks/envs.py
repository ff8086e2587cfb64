"""Where each real target's virtual environment lives (built by `make targets`).

Real frameworks pin heavy, conflicting dependencies (torch, ray, transformers; verifiers 0.1
against 0.4), so each gets its own environment and runs there in a worker process; the bench
itself stays light. `ROLLOUT_BENCH_TARGETS_DIR` moves the folder (default: `.targets` in the
checkout the bench runs from, or the current directory for an installed bench).
"""

from __future__ import annotations

import os
from pathlib import Path

# target name -> environment folder names, first built wins (slime's is optional: `make slime-env`)
TARGET_ENVS: dict[str, tuple[str, ...]] = {
    "miles": ("miles",),
    "slime": ("slime",),
    "slime-retool": ("slime",),  # slime's retool example: slime's environment
    "verifiers": ("verifiers",),
    "areal": ("areal",),
    "verl": ("verl", "verl-0.9"),  # 0.8.0, else 0.9.1
    "open-instruct": ("open-instruct",),  # optional: `make open-instruct-env`
    "prime-rl": ("prime-rl",),  # optional: `make prime-rl-env`
}


def targets_dir() -> Path:
    configured = os.environ.get("ROLLOUT_BENCH_TARGETS_DIR")
    if configured:
        return Path(configured)
    checkout = Path(__file__).resolve().parents[3]  # bench/targets/frameworks/envs.py -> the checkout
    if (checkout / "pyproject.toml").exists():
        return checkout / ".targets"
    return Path.cwd() / ".targets"


def target_python(name: str) -> str | None:
    """The interpreter of `name`'s environment, or None if it was not built (or `name` needs none).

    `ROLLOUT_BENCH_<NAME>_PYTHON` (e.g. `ROLLOUT_BENCH_MILES_PYTHON`) names another one; it counts only
    if it exists, so a test asking for it skips rather than failing on a stale path.
    """
    family = name.partition(":")[0]
    configured = os.environ.get(python_variable(family))
    if configured:
        return configured if Path(configured).exists() else None
    return next(filter(None, map(environment_python, TARGET_ENVS.get(family, ()))), None)


def python_variable(family: str) -> str:
    """The variable naming another interpreter for a framework's targets: `ROLLOUT_BENCH_MILES_PYTHON`."""
    return f"ROLLOUT_BENCH_{family.upper().replace('-', '_')}_PYTHON"


def environment_python(folder: str) -> str | None:
    """The interpreter of one environment folder (`verl-0.9`), or None if it was not built."""
    python = targets_dir() / folder / "bin" / "python"
    return str(python) if python.exists() else None


# the Makefile rule that builds an environment folder: `make targets` builds the default set (TARGETS=... for some),
# the optional ones have their own rule
BUILT_BY = {"slime": "make slime-env", "open-instruct": "make open-instruct-env", "prime-rl": "make prime-rl-env"}
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")


def missing_environment_hint(name: str) -> str | None:
    """What to do when a built-in framework target failed to import because its environment was not found: the
    worker then ran under the bench's own interpreter, and "No module named 'miles'" alone does not say that the
    bench looks for an environment, where, or how one is built. None for a plug-in or a target whose one was found."""
    family = name.partition(":")[0]
    folders = TARGET_ENVS.get(family)
    if not folders or target_python(family) is not None:
        return None
    variable = python_variable(family)
    if os.environ.get(variable):
        return f"{variable}={os.environ[variable]} does not exist; unset it or name {family}'s interpreter"
    looked = " or ".join(str(targets_dir() / folder / "bin" / "python") for folder in folders)
    build = BUILT_BY.get(folders[0], f"make targets TARGETS={folders[0]}")
    return (f"{family} runs in its own environment, and none was found (looked for {looked}): build it with "
            f"`{build}` in the bench's checkout (TARGETS_DIR=DIR builds it elsewhere), or set "
            f"ROLLOUT_BENCH_TARGETS_DIR to the folder that holds it, or give its interpreter with --python")
