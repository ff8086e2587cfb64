"""The data the trainer's side draws prompts from, handed over step by step by the bench.

open-instruct's `DataPreparationActor` draws its prompts from an endless `HFDataLoader` (it reshuffles and starts
another epoch): `async_steps * prompts_per_step` to prime the generator, then one per result
`accumulate_inference_batches` takes (`replenish_prompts`), dropped stale ones included. The bench's data is the
job's groups, and in a run of many steps (`run --steps K`) only the running step's groups are known. So the
trainer draws from this feed instead: the rows of the steps handed over so far, in order. A draw that finds no row
(the generator runs ahead of the data the bench has handed over) is owed, not sent: the prompt queue keeps count
(`PromptQueue.owed`), and the trainer makes the owed draws first when the next step's rows arrive; after the last
step they are never made (open-instruct would have started another epoch, which the job does not have).
"""

from __future__ import annotations

from typing import Any

OWED_EPOCH = -1  # the epoch number a draw past the handed-over rows carries: the prompt queue keeps it back


class StepFeed:
    """An iterator over the handed-over rows, with the `_epoch` open-instruct reads after each draw."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.drawn = 0
        self._epoch = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)

    def skip_undrawn(self) -> int:
        """Leave out the rows not drawn yet (a step that raised before drawing them): they belong to that step,
        whose error accounts for them; how many were left out."""
        left = len(self.rows) - self.drawn
        self.drawn = len(self.rows)
        return left

    def __iter__(self) -> StepFeed:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.drawn < len(self.rows):
            self._epoch = 0
            self.drawn += 1
            return self.rows[self.drawn - 1]
        self._epoch = OWED_EPOCH
        return self.rows[-1]  # a stand-in row: the prompt queue keeps an owed draw back, it is never generated


class PromptQueue:
    """The Ray prompt queue as the trainer's side sees it: the real queue for drawn rows, a count for owed draws,
    and which trajectories were put in (what the generator owes requests for)."""

    def __init__(self, real: Any, trajectories_of: Any) -> None:
        self.real, self.trajectories_of = real, trajectories_of
        self.added = 0
        self.owed = 0
        self.expected: set[str] = set()

    def put(self, item: Any, *args: Any, **kwargs: Any) -> None:
        if int(str(item.prompt_id).split("_", 1)[0]) == OWED_EPOCH:
            self.owed += 1
            return
        self.added += 1
        self.expected.update(self.trajectories_of(item.index))
        self.real.put(item, *args, **kwargs)
