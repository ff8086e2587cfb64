"""The reward function AReaL's workflows load by dotted path and run in their process pool.

It honours the `raise_after_generate` fault the way a crashing reward function would, and otherwise gives
the reward the bench passed along with the task data.
"""

from __future__ import annotations

from typing import Any

from faults.hooks import raise_if_poisoned

PATH = f"{__name__}.score"


def score(prompt: str, completion: str, prompt_ids: list[int], completion_ids: list[int], **data: Any) -> float:
    raise_if_poisoned(completion)
    return float(data.get("bench_reward", 1.0))
