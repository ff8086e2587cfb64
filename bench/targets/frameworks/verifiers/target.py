"""`verifiers`: real verifiers 0.1 environments against the bench's OpenAI route (seed mode 003).

Runs inside the verifiers virtual environment (`make targets`; `--python`), never in the
harness: verifiers is imported in `run` only. From the job's trajectories it builds an
in-memory `datasets.Dataset` (prompt messages, answer, and per row an `info` naming the
trajectory and its recorded tool schemas) and a real environment:

- `single_turn` (rlvr traces): `vf.SingleTurnEnv` with a `vf.Rubric` scoring the boxed answer
  (`vf.Parser(extract_fn=vf.extract_boxed_answer)`) against the trace's answer;
- `tool` (agentic traces): `vf.StatefulToolEnv` whose tools answer from the trace
  (`RecordedTools`: deterministic, offline; the tool schemas sent are the recorded ones, so the
  replay keeps matching), rubric: the recorded reward when the rollout ran to its recorded
  end without error.

`job.options["env"]` chooses (default: `tool` when the trajectories carry tools). Each group
goes through `env.run_group` (what prime-rl calls) with one `vf.ClientConfig` of type
`openai_chat_completions` at `job.base_url + "/v1"`, resolved once by verifiers'
`resolve_client`; verifiers sends `X-Bench-Trajectory` itself, from the rollout state
(`extra_headers_from_state`), so the bench identifies every request exactly. A counting hook
on the SDK's HTTP client gives the requests each rollout sent (SDK retries included).

Options: `max_retries` (the OpenAI SDK's, verifiers' `ClientConfig` default 10 unless set),
`env_retries` (verifiers' own `run_group` retry of `InfraError`/`InvalidModelResponseError`,
default 0), `trace` (where answers, rewards and tool outputs are read; default: the shipped
trace of the trajectories' kind), `max_reschedules` / `max_group_retries` (the scheduler's).

Variants name what consumes the rollouts; verifiers itself is the same in all three:
- `plain`: each group once, every rollout reported as verifiers left it (errors as `failed`).
- `unfixed` (default): prime-rl's scheduler before #2579 (`reference.scheduler.schedule_groups`):
  a group with an errored rollout is replaced by a new group, whatever the error.
- `fixed`: prime-rl#2579 consuming verifiers#1427's `is_retryable` flag: retryable errors get
  a replacement group, anything else fails the batch fast. verifiers 0.1.14 does not write the
  flag; this adapter computes it the way #1427 does (the rollout's live error chain contains a
  `vf.InfraError` or `vf.InvalidModelResponseError`) and hands the scheduler the real dict plus
  that flag. `details["error"]` is always the dict exactly as verifiers serialized it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench.records.attribution import TRAJECTORY_HEADER
from bench.targets.base import Emit, RolloutJob, TrajectorySpec
from bench.targets.recorded_tools import RecordedTools
from bench.targets.reference.scheduler import RolloutState, schedule_groups
from bench.trace import open_trace
from bench.trace.shipped import shipped_trace

from .records import record_of

VARIANTS = ("unfixed", "fixed", "plain")
ENVS = ("single_turn", "tool")
API_KEY_VAR = "ROLLOUT_BENCH_API_KEY"  # unset: the SDK sends "EMPTY"; never PRIME_API_KEY (reads ~/.prime)
STATE_KEY = "bench_trajectory"  # the state field verifiers turns into the X-Bench-Trajectory header
RETRYABLE_KEY = "bench_is_retryable"  # verifiers#1427's flag, computed on the live error in the rollout
_TRAJECTORY_ARG, _TURN_ARG = "bench_trajectory", "bench_turn"  # tool arguments injected from the state


class VerifiersTarget:
    def __init__(self, variant: str = "unfixed") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"verifiers has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.variant = variant
        self.name = f"verifiers:{variant}"
        self.fail_fast = variant == "fixed"  # prime-rl#2579's declared policy: a terminal error fails the batch

    def warm_up(self, options: dict[str, Any]) -> None:
        """Import verifiers (seconds) before the job arrives: the worker calls this while the bench loads."""
        import verifiers  # noqa: F401
        import verifiers.clients  # noqa: F401

    def framework_info(self) -> dict[str, str]:
        """The installed verifiers and the OpenAI SDK it talks through."""
        return {"framework": "verifiers", "version": importlib.metadata.version("verifiers"),
                "openai": importlib.metadata.version("openai")}

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        import verifiers as vf
        from verifiers.clients import resolve_client

        kind = _env_kind(job)
        facts = await asyncio.to_thread(TraceFacts.load, _trace_path(job, kind), job.trajectories)
        env = build_env(vf, kind, job, facts)
        config = vf.ClientConfig(
            client_type="openai_chat_completions", api_base_url=job.base_url + "/v1", api_key_var=API_KEY_VAR,
            max_retries=int(job.options.get("max_retries", vf.ClientConfig.model_fields["max_retries"].default)),
            extra_headers_from_state={TRAJECTORY_HEADER: STATE_KEY},
        )
        client = resolve_client(config)  # once, as run_group would per call
        requests = _count_requests(client.client)
        runner = _GroupRunner(env, client, job, kind, requests, int(job.options.get("env_retries", 0)))
        try:
            if self.variant == "plain":
                await asyncio.gather(*(runner.emit_group(members, emit) for members in job.groups().values()))
            else:
                await schedule_groups(job, runner.states, emit, fixed=self.variant == "fixed")
        finally:
            await client.close()


class TraceFacts:
    """What the environment needs from the trace beyond prompts: answers, rewards, tool outputs."""

    def __init__(self, answers: dict[str, str], tools: RecordedTools) -> None:
        self.answers, self.tools = answers, tools

    @classmethod
    def load(cls, path: Path | None, specs: list[TrajectorySpec]) -> "TraceFacts":
        wanted = {spec.id: spec for spec in specs}
        answers: dict[str, str] = {}
        outputs: dict[str, list[list[tuple[str, dict[str, Any], str]]]] = {}
        rewards: dict[str, float | None] = {}
        if path is not None:
            with open_trace(path, check=False) as reader:
                for trajectory in reader:
                    spec = wanted.get(trajectory.id)
                    if spec is None or list(trajectory.prompt.ids) != list(spec.prompt_ids):
                        continue  # another trace's trajectory of the same name answers nothing
                    if isinstance(trajectory.metadata.get("answer"), str):
                        answers[trajectory.id] = trajectory.metadata["answer"]
                    rewards[trajectory.id] = trajectory.reward
                    outputs[trajectory.id] = [
                        [(call.name, json.loads(call.arguments), {o.call_id: o.text for o in turn.tool_outputs}
                          .get(call.id, "")) for call in turn.tool_calls] for turn in trajectory.turns]
        return cls(answers, RecordedTools(outputs, rewards))


def _env_kind(job: RolloutJob) -> str:
    kind = job.options.get("env") or ("tool" if any(spec.tools for spec in job.trajectories) else "single_turn")
    if kind not in ENVS:
        raise ValueError(f"verifiers option env={kind!r}: expected one of {', '.join(ENVS)}")
    return str(kind)


def _trace_path(job: RolloutJob, kind: str) -> Path | None:
    configured = job.options.get("trace")
    if configured:
        return Path(configured)
    return shipped_trace("agentic-500" if kind == "tool" else "rlvr-500")


def _tool_defs(spec: TrajectorySpec) -> list[dict[str, Any]]:
    """The recorded OpenAI tool schemas in verifiers' provider-agnostic form (sent back unchanged)."""
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"].get("parameters", {})} for t in spec.tools or []]


def dataset_rows(job: RolloutJob, facts: TraceFacts) -> list[dict[str, Any]]:
    """One row per trajectory: the group's prompt, answer and example id; `info` (JSON) names the member."""
    examples = {group: index for index, group in enumerate(job.groups())}
    rows = []
    for spec in job.trajectories:
        if not spec.messages:
            raise ValueError(f"trajectory {spec.id}: the verifiers target needs the prompt as chat messages "
                             "(the trace's prompt.messages); this trajectory has only token ids")
        info: dict[str, Any] = {STATE_KEY: spec.id, "recorded_turns": spec.turns,
                                "recorded_reward": facts.tools.rewards.get(spec.id)}
        if spec.tools:
            info["tool_defs"] = _tool_defs(spec)
        rows.append({"prompt": spec.messages, "answer": facts.answers.get(spec.id, ""),
                     "example_id": examples[spec.group], "info": json.dumps(info)})
    return rows


def build_env(vf: Any, kind: str, job: RolloutJob, facts: TraceFacts) -> Any:
    """A real verifiers environment over an in-memory dataset of the job's prompts."""
    from datasets import Dataset

    dataset = Dataset.from_list(dataset_rows(job, facts))
    mixin = _state_mixin(vf)
    if kind == "single_turn":
        parser = vf.Parser(extract_fn=vf.extract_boxed_answer)

        def boxed_answer(completion: Any, answer: str) -> float:
            return 1.0 if answer and parser.parse_answer(completion) == answer else 0.0

        cls = type("BenchSingleTurnEnv", (mixin, vf.SingleTurnEnv), {})
        return cls(dataset=dataset, parser=parser, rubric=vf.Rubric(funcs=[boxed_answer], parser=parser))

    def recorded_reward(info: dict[str, Any], state: Any) -> float:
        """The trace's reward for a rollout that ran its recorded turns and ended without error."""
        ran = len(state.get("trajectory") or [])
        if state.get("error") is not None or ran != info.get("recorded_turns"):
            return 0.0
        return float(info.get("recorded_reward") or 0.0)

    def update_tool_args(self: Any, tool_name: str, tool_args: dict[str, Any], messages: Any, state: Any,
                         **kwargs: Any) -> dict[str, Any]:
        return {**tool_args, _TRAJECTORY_ARG: state[STATE_KEY], _TURN_ARG: len(state["trajectory"]) - 1}

    cls = type("BenchToolEnv", (mixin, vf.StatefulToolEnv), {"update_tool_args": update_tool_args})
    env = cls(dataset=dataset, rubric=vf.Rubric(funcs=[recorded_reward]),
              max_turns=max((spec.turns for spec in job.trajectories), default=0) + 1)  # past the recording: its own end shows
    schemas = {d["name"]: d for spec in job.trajectories for d in _tool_defs(spec)}
    for name, schema in schemas.items():
        env.add_tool(_recorded_tool(name, schema, facts.tools), args_to_skip=[_TRAJECTORY_ARG, _TURN_ARG])
    return env


def _state_mixin(vf: Any) -> type:
    """Hooks every bench environment adds to the real one, through verifiers' documented extension points."""

    class BenchState:
        async def setup_state(self, state: Any) -> None:
            state[STATE_KEY] = state["info"][STATE_KEY]  # becomes the X-Bench-Trajectory header
            await super().setup_state(state)  # type: ignore[misc]

        @vf.cleanup
        async def bench_retry_flag(self, state: Any) -> None:
            """verifiers#1427's `is_retryable`, decided while the error is still a live exception."""
            state[RETRYABLE_KEY] = is_retryable_1427(vf, state.get("error"))

    return BenchState


def is_retryable_1427(vf: Any, error: Any) -> bool | None:
    """verifiers#1427: retryable when the causal chain holds an `InfraError` or `InvalidModelResponseError`."""
    if not isinstance(error, BaseException):
        return None
    from verifiers.utils.error_utils import get_error_chain

    return any(isinstance(e, (vf.InfraError, vf.InvalidModelResponseError)) for e in get_error_chain(error))


def _recorded_tool(name: str, schema: dict[str, Any], tools: RecordedTools) -> Callable[..., str]:
    """A tool function named and shaped like the recorded one, answering with the recorded output."""

    def call(**arguments: Any) -> str:
        trajectory, turn = arguments.pop(_TRAJECTORY_ARG), arguments.pop(_TURN_ARG)
        return tools.run(trajectory, turn, {"name": name, "arguments": arguments})

    properties = list((schema.get("parameters") or {}).get("properties") or {})
    parameters = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=str) for p in properties]
    parameters += [inspect.Parameter(_TRAJECTORY_ARG, inspect.Parameter.KEYWORD_ONLY, annotation=str),
                   inspect.Parameter(_TURN_ARG, inspect.Parameter.KEYWORD_ONLY, annotation=int)]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = schema.get("description") or name
    call.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": str}
    return call


def _count_requests(openai_client: Any) -> Counter[str]:
    """Requests sent per trajectory (SDK retries included), from a hook on the SDK's HTTP client."""
    counts: Counter[str] = Counter()

    async def count(request: Any) -> None:
        counts[request.headers.get(TRAJECTORY_HEADER, "")] += 1

    http = openai_client._client  # the httpx.AsyncClient verifiers built from the ClientConfig
    hooks = dict(http.event_hooks)
    hooks["request"] = [*hooks.get("request", []), count]
    http.event_hooks = hooks
    return counts


class _GroupRunner:
    """One group rollout through `env.run_group`, converted to records and scheduler states."""

    def __init__(self, env: Any, client: Any, job: RolloutJob, kind: str, requests: Counter[str],
                 env_retries: int) -> None:
        self.env, self.client, self.job, self.kind = env, client, job, kind
        self.requests, self.env_retries = requests, env_retries
        self.inputs = {json.loads(row["info"])[STATE_KEY]: row for row in env.get_dataset().to_list()}
        size = max((len(members) for members in job.groups().values()), default=1)
        self.limit = asyncio.Semaphore(max(1, job.concurrency // size))  # groups in flight: rollouts / group size
        self.attempts: Counter[str] = Counter()

    async def states(self, members: list[TrajectorySpec]) -> list[RolloutState]:
        spec = members[0]
        params = spec.sampling_params
        sampling: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}
        for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("max_new_tokens", "max_tokens")):
            if params.get(ours) is not None:
                sampling[theirs] = params[ours]
        if params.get("top_k") is not None:
            sampling["extra_body"]["top_k"] = params["top_k"]
        self.attempts[spec.group] += 1
        async with self.limit:
            outputs = await self.env.run_group([self.inputs[m.id] for m in members], self.client, "bench", sampling,
                                               max_retries=self.env_retries,
                                               state_columns=["trajectory", RETRYABLE_KEY])
        states = []
        for member, output in zip(members, outputs):
            flag = output.get(RETRYABLE_KEY)
            record = record_of(output, member, details={
                "env": self.kind, "requests": self.requests[member.id], "group_attempt": self.attempts[spec.group],
                "is_retryable_1427": flag})
            error = dict(output["error"]) | {"is_retryable": flag} if output.get("error") else None
            states.append(RolloutState(member, record, error))
        return states

    async def emit_group(self, members: list[TrajectorySpec], emit: Emit) -> None:
        for state in await self.states(members):
            emit(state.record)  # type: ignore[arg-type]
