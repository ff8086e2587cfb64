"""`miles`: miles' real rollout code (PyPI `miles-rl`), run in its own environment against the bench server.

The 0.0.2 default is the legacy path `miles.rollout.sglang_rollout` (`generate_rollout`,
`generate_and_rm_group(args, group, sampling_params, evaluation)`, the `GenerateState`
singleton); traces with tool calls go through miles' own multi-turn generator
(`miles.rollout.generate_hub.multi_turn`). Variants: `unfixed` (miles as shipped) and
`patched` (the fixed group pattern of `frameworks/slime/patch.py` applied at run time).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any

from ..slime import plugins, weights
from ..slime.family import Framework, Modules, SlimeFamilyTarget

DISTRIBUTION = "miles-rl"


class Miles(Framework):
    name = "miles"
    root = "miles"
    multi_turn = "miles.rollout.generate_hub.multi_turn.generate"
    weight_sync = weights.MILES

    def version(self) -> str:
        return f"miles {importlib.metadata.version(DISTRIBUTION)}"

    def info(self) -> dict[str, str]:
        return {"framework": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION)}

    def generate_function(self, mods: Modules, path: str | None) -> plugins.InnerGenerate:
        """miles loads generate functions through its compatibility layer (new-style `GenerateFnInput` or legacy)."""
        if path is None:
            return super().generate_function(mods, path)
        compatibility = importlib.import_module("miles.rollout.inference_rollout.compatibility")
        base_types = importlib.import_module("miles.rollout.base_types")
        function = compatibility.load_generate_function(path)

        async def call(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool) -> Any:
            state = mods.rollout.GenerateState(args)
            output = function(base_types.GenerateFnInput(state=state, sample=sample, sampling_params=sampling_params,
                                                         evaluation=evaluation))
            output = await output if inspect.isawaitable(output) else output
            return output.samples
        return call


class MilesTarget(SlimeFamilyTarget):
    framework = Miles()
