"""The verifiers environment prime-rl trains on in a bench run: one single-turn task per group of the job.

prime-rl loads an environment by id (`vf.load_environment`), in its orchestrator and again in the env server it
spawns (and in that server's worker processes), so this module is that id: importable from the bench's source
alone, with verifiers and datasets, never prime-rl (whose GPU imports need the placeholders of `stubs`).
`load_environment(rows=PATH)` reads the rows the adapter wrote (`write_rows`): per group its prompt messages,
the trace's answer, and an `info` naming the group's members.

The environment is scored as a group (its reward function takes `completions` and `answers`), so prime-rl's
scheduler sends each group whole through `run_group` and, on a failed rollout, replaces the whole group: the
churn seed 003 is about. A group's copies of the example are identical; member k is the k-th rollout, named in
its `info` before the group leaves the orchestrator, and the rollout's state turns that name into the
`X-Bench-Trajectory` header (verifiers' `extra_headers_from_state`), so the bench identifies every request
exactly, retries and replacement groups included.

Two things only a bench run needs, both in `run_group` on the orchestrator's side of the env server:
- a parked group (the scheduler asks for more work once the job's groups are all out; `buffer` hands it this)
  never leaves the orchestrator and never finishes: it stands for the next step's work and sends nothing;
- `observe` (set by the adapter) sees every group's outputs as they come back, the evidence for records of
  groups the batch never returned (failed, given up) and the attempt count of each group, with the policy the
  scheduler sent the group under: prime-rl salts every request's prefix cache with its checkpoint step then
  (`scheduler.py`, `schedule_rollout`: `cache_salt`), which is the version a record carries;
- a reply the fault engine poisoned (`raise_after_generate`) makes the group's post-processing raise there, as an
  environment's own crashing post-processing would (verifiers' rubric catches a reward function's exceptions and
  scores 0, so a crash in the reward function would never reach prime-rl).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

STATE_KEY = "bench_trajectory"  # the state field verifiers turns into the X-Bench-Trajectory header
MEMBERS_KEY = "bench_members"  # info: the group's trajectory ids, in member order
GROUP_KEY = "bench_group"  # info: the job's group id
PARK_KEY = "bench_park"  # info: a parked group (see the module docstring)
ENV_ID = __name__  # what prime-rl's config names (`vf.load_environment` imports it)


def info_of(example: dict[str, Any]) -> dict[str, Any]:
    """An example's `info`, which a dataset row holds as JSON text."""
    info = example.get("info") or {}
    return json.loads(info) if isinstance(info, str) else dict(info)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """The job's rows for `load_environment` (prompt, answer, example_id, info as JSON text)."""
    path.write_text(json.dumps(rows))


def _raise_if_poisoned(output: dict[str, Any]) -> None:
    """`faults.hooks.raise_if_poisoned` on a rollout's completion, the error naming its trajectory."""
    from bench.records.attribution import stamp
    from faults.hooks import InjectedFault, raise_if_poisoned

    try:
        raise_if_poisoned(json.dumps(output.get("completion"), default=str))
    except InjectedFault as error:
        stamp(error, info_of(output).get(STATE_KEY))
        raise


def load_environment(rows: str) -> Any:
    """A `vf.SingleTurnEnv` over the rows at `rows`, scored as a group on the boxed answer."""
    import verifiers as vf
    from datasets import Dataset

    dataset = Dataset.from_list(json.loads(Path(rows).read_text()))
    parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

    def boxed_answers(completions: list[Any], answers: list[str]) -> list[float]:
        """1.0 where the completion's boxed answer is the trace's answer."""
        return [1.0 if answer and parser.parse_answer(completion) == answer else 0.0
                for completion, answer in zip(completions, answers)]

    class BenchGroupEnv(vf.SingleTurnEnv):
        observe: Callable[[dict[str, Any], list[dict[str, Any]], str | None], None] | None = None

        async def setup_state(self, state: Any) -> None:
            state[STATE_KEY] = state["info"][STATE_KEY]  # becomes the X-Bench-Trajectory header
            await super().setup_state(state)

        async def run_group(self, group_inputs: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
            info = info_of(group_inputs[0])
            if info.get(PARK_KEY):
                await asyncio.Event().wait()  # cancelled when the scheduler stops
            if STATE_KEY not in info:  # the orchestrator's identical copies: member k is the k-th
                members = info[MEMBERS_KEY]
                if len(group_inputs) != len(members):
                    raise ValueError(f"group {info[GROUP_KEY]}: prime-rl sent {len(group_inputs)} rollouts for "
                                     f"its {len(members)} members (rollouts_per_example is the group size)")
                group_inputs = [{**rollout, "info": json.dumps({**info, STATE_KEY: member})}
                                for rollout, member in zip(group_inputs, members)]
            outputs = await super().run_group(group_inputs, *args, **kwargs)
            if self.observe is not None:  # with the policy prime-rl scheduled the group under (its cache salt)
                extra = (kwargs.get("sampling_args") or {}).get("extra_body") or {}
                self.observe(info, outputs, extra.get("cache_salt"))
            for output in outputs:
                _raise_if_poisoned(output)
            return outputs

    return BenchGroupEnv(dataset=dataset, parser=parser, rubric=vf.Rubric(funcs=[boxed_answers], parser=parser))
