"""A user's plug-ins for the slime-family targets (`custom_generate_function_path`, `custom_rm_path`), and the
slime adapter pointed at miles' code, whose legacy rollout module has slime's shape.

Loaded by dotted path inside the target's worker, as slime and miles load a user's plug-ins.
"""

from __future__ import annotations

import importlib
from typing import Any

from bench.targets.frameworks.slime.family import SlimeFamilyTarget
from bench.targets.frameworks.slime.target import Slime

USER_REWARD = 0.25
MARK = "user_generate"


async def marking_generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """A legacy-signature generate function: the framework's own generate, with a note in the sample's metadata."""
    root = type(sample).__module__.split(".")[0]  # slime or miles
    rollout = importlib.import_module(f"{root}.rollout.sglang_rollout")
    sample = await rollout.generate(args, sample, sampling_params)
    sample.metadata[MARK] = {"evaluation": evaluation}
    return sample


async def marked_reward(args: Any, sample: Any, **kwargs: Any) -> float:
    """A reward that tells whether `marking_generate` ran for this sample."""
    return USER_REWARD if MARK in (sample.metadata or {}) else -1.0


class SlimeLinesOnMiles(Slime):
    """slime's adapter lines (engine count, legacy generate calls) over miles' slime-shaped rollout module."""

    name = "slime-lines-on-miles"
    root = "miles"

    def prepare(self, options: dict[str, Any]) -> None:
        self.source = None

    def version(self) -> str:
        return "slime adapter on miles"


class SlimeOnMiles(SlimeFamilyTarget):
    framework = SlimeLinesOnMiles()
