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
    configured = os.environ.get(f"ROLLOUT_BENCH_{family.upper().replace('-', '_')}_PYTHON")
    if configured:
        return configured if Path(configured).exists() else None
    for folder in TARGET_ENVS.get(family, ()):
        python = targets_dir() / folder / "bin" / "python"
        if python.exists():
            return str(python)
    return None


def environment_python(folder: str) -> str | None:
    """The interpreter of one environment folder (`verl-0.9`), or None if it was not built."""
    python = targets_dir() / folder / "bin" / "python"
    return str(python) if python.exists() else None
