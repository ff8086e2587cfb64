"""Runs of many training steps (`rollout-bench run --steps K`): the rollout called K times in one worker process.

A trainer calls its rollout every step, in the same process, with the policy's weights updated in between.
Whatever a step leaves behind (orphaned tasks still calling the server, threads, sockets, child processes, a
process-wide singleton a failed step dirtied) is only seen by a run that calls it again. The pieces, one job each:

- `loop`: the worker's side: calls the target once per step with its slice of the trajectories, measures the
  process after each step (`resources`) and tells the bench the step ended (`/bench/step`), waiting for the bench
  to publish the next step's weights before starting it.
- `board`: the bench's side, in the server: per step, the fault plan's rules for that step, the weight version
  published (or held by a `hold_weights` rule), when the step started and ended, what the worker measured.
- `checks`: findings across steps (resources that grow with steps, requests arriving for a step after it
  returned, a step failing after an earlier one failed with no injected fault to explain it).
- `fresh`: a failure after a failed step rerun alone in a fresh process: carried over, or the step's own.
- `run`: the runner's side (slicing the trace into steps, the board, per-step loss causes and findings).
- `table`, `report`: the per-step rows, `steps.csv`, `steps.png` and the terminal's lines.
"""

from __future__ import annotations

STEP_ROUTE = "/bench/step"
STEP_FAILURE_POLICIES = ("stop", "continue")
