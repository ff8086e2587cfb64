"""miles writing its debug rollout data while the bench runs it: the dump `rollout-bench import` reads.

miles' own writer (`RolloutManager._save_debug_rollout_data` in `miles.ray.rollout`) cannot be imported
on CPU (that module pulls in SGLang's engine: triton, PIL). This target runs miles' real rollout
(`generate_rollout` against the bench server, as the `miles` target does) and, after each rollout
step, writes what that method writes, the same way: `torch.save({"rollout_id": ..., "samples":
[sample.to_dict() for sample in samples]}, PATH.format(rollout_id=...))` with miles' own `Sample.to_dict`
and torch, for the flattened samples the step returned (miles' `_get_rollout_data` flattens them the same
way; its trim to a multiple of the global batch size is left out: the bench sets no batch size).
`PATH` is the framework argument `save_debug_rollout_data` (target option `args`), as miles' flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.targets.frameworks.miles.target import MilesTarget


class DumpingMiles(MilesTarget):
    def _train(self, job: Any, args: Any, mods: Any) -> Any:
        template = args.save_debug_rollout_data
        if template is None:
            raise ValueError("DumpingMiles needs the framework argument save_debug_rollout_data (target option args)")
        real = mods.rollout.generate_rollout

        def generate_and_save(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
            import torch

            output = real(args, rollout_id, data_source, evaluation=evaluation)
            samples = output.samples
            while samples and isinstance(samples[0], list):
                samples = [s for group in samples for s in group]
            path = Path(template.format(rollout_id=str(rollout_id)))
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(dict(rollout_id=rollout_id, samples=[sample.to_dict() for sample in samples]), path)
            return output

        mods.rollout.generate_rollout = generate_and_save
        try:
            return super()._train(job, args, mods)
        finally:
            mods.rollout.generate_rollout = real
