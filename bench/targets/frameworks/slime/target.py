"""`slime`: slime's real rollout code (THUDM/slime, source only), run from a checkout against the bench server.

The adapter is the slime family's (`family.py`, shared with miles); what is slime's own:
- it is imported from a checkout: the `slime_path` target option, else `ROLLOUT_BENCH_SLIME_PATH`,
  else a `slime` already importable (on `PYTHONPATH`);
- `init_http_client` counts engines with `rollout_num_engines` (0 makes it a no-op and every post
  retries for 60 s), so the adapter says there is one engine, the bench server;
- custom generate functions are plain `generate(args, sample, sampling_params[, evaluation])`,
  called as slime's `generate_and_rm` calls them; slime ships no multi-turn tool generator in its
  package (retool and the other agents are examples, given as `custom_generate_function_path`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from bench.targets.base import RolloutJob

from .family import Framework, OptionError, SlimeFamilyTarget

PATH_ENV = "ROLLOUT_BENCH_SLIME_PATH"


def checkout(options: dict[str, Any]) -> Path | None:
    """The slime checkout to import from, if one is named (option first, then the environment variable)."""
    named = options.get("slime_path") or os.environ.get(PATH_ENV)
    if not named:
        return None
    path = Path(named).expanduser().resolve()
    if not (path / "slime" / "rollout" / "sglang_rollout.py").is_file():
        raise OptionError(f"slime_path {named!r}: no slime/rollout/sglang_rollout.py there (a slime checkout?)")
    return path


class Slime(Framework):
    name = "slime"
    root = "slime"

    def __init__(self) -> None:
        self.source: Path | None = None

    def prepare(self, options: dict[str, Any]) -> None:
        path = checkout(options)
        if path is not None:
            loaded = sys.modules.get("slime")
            if loaded is not None and Path(loaded.__file__ or "").resolve().parents[1] != path:
                raise OptionError(f"slime_path {str(path)!r}: this process already imported slime from "
                                  f"{loaded.__file__}; one checkout per process")
            if str(path) not in sys.path:
                sys.path.insert(0, str(path))
        elif importlib.util.find_spec("slime") is None:
            raise OptionError(f"slime is not importable: give the target option slime_path or set {PATH_ENV} "
                              "to a slime checkout")
        spec = importlib.util.find_spec("slime")
        self.source = Path(spec.origin).resolve().parents[1] if spec and spec.origin else None

    def version(self) -> str:
        return f"slime (source {self.source})" if self.source else "slime"

    def extra_args(self, job: RolloutJob) -> dict[str, Any]:
        return {"rollout_num_engines": 1}


class SlimeTarget(SlimeFamilyTarget):
    framework = Slime()
