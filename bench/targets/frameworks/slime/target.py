"""`slime`: slime's real rollout code (THUDM/slime, source only), run from a checkout against the bench server.

The adapter is the slime family's (`family.py`, shared with miles); what is slime's own:
- it is imported from a checkout: `--source DIR` (the `source` target option; `--slime-path` / `slime_path`
  still work), else `ROLLOUT_BENCH_SLIME_PATH`, else a `slime` already importable (on `PYTHONPATH`); the
  report names the checkout and its commit;
- `init_http_client` counts engines with `rollout_num_engines` (0 makes it a no-op and every post
  retries for 60 s), so the adapter says there is one engine, the bench server;
- custom generate functions are plain `generate(args, sample, sampling_params[, evaluation])`,
  called as slime's `generate_and_rm` calls them; slime ships no multi-turn tool generator in its
  package (retool and the other agents are examples, given as `custom_generate_function_path`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from bench.targets.base import RolloutJob

from ..checkout import UNKNOWN, Checkout, CheckoutError, named_source, read_checkout
from .family import Framework, OptionError, SlimeFamilyTarget

PATH_ENV = "ROLLOUT_BENCH_SLIME_PATH"


MARKER = "slime/rollout/sglang_rollout.py"


def checkout(options: dict[str, Any]) -> Checkout | None:
    """The slime checkout a run names (option first, then the environment variable), if it names one."""
    named = named_source(options, PATH_ENV, "slime_path")
    if named is None:
        return None
    try:
        return read_checkout("slime", named, MARKER)
    except CheckoutError as error:
        raise OptionError(str(error)) from None


class Slime(Framework):
    name = "slime"
    root = "slime"

    def __init__(self) -> None:
        self.checkout: Checkout | None = None

    def prepare(self, options: dict[str, Any]) -> None:
        found = checkout(options)
        if found is not None:
            loaded = sys.modules.get("slime")
            if loaded is not None and Path(loaded.__file__ or "").resolve().parents[1] != found.path:
                raise OptionError(f"slime source {str(found.path)!r}: this process already imported slime from "
                                  f"{loaded.__file__}; one checkout per process")
            if str(found.path) not in sys.path:
                sys.path.insert(0, str(found.path))
            self.checkout = found
            return
        spec = importlib.util.find_spec("slime")
        if spec is None or not spec.origin:
            raise OptionError(f"slime is not importable: give --source DIR (a slime checkout) or set {PATH_ENV}")
        self.checkout = read_checkout("slime", Path(spec.origin).resolve().parents[1], MARKER)

    def version(self) -> str:
        if self.checkout is None:
            return "slime"
        commit = "" if self.checkout.commit == UNKNOWN else f" {self.checkout.commit[:12]}"
        return f"slime{commit} (source {self.checkout.path})"

    def info(self) -> dict[str, str]:
        return self.checkout.info() if self.checkout is not None else {"framework": "slime"}

    def extra_args(self, job: RolloutJob) -> dict[str, Any]:
        return {"rollout_num_engines": 1}


class SlimeTarget(SlimeFamilyTarget):
    framework = Slime()
