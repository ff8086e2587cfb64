"""The slime family's real rollout code (slime, miles) run against the bench server.

miles forked slime's rollout and both still share its shape: `generate_rollout(args,
rollout_id, data_source, evaluation)` runs on the framework's own background event loop
(`utils.async_utils.run`), submits one `generate_and_rm_group(args, group, sampling_params,
evaluation)` task per prompt group, which gathers one `generate_and_rm` per sample: generate
(POST `/generate` through the framework's httpx client), then the reward function. So one
adapter drives both; `Framework` holds what differs (the import root, how a custom generate
function is called, the version string).

One run, in the target's own process:
- the args namespace is built offline from the job (names the code reads and the job does not
  decide are None, as an unset option is); the tokenizer folder is `hf_checkpoint`, the bench
  server is the router, the job's concurrency is the server concurrency;
- at a run's first step, the process-wide state a previous run left is evicted (the `GenerateState` singleton, the
  httpx client bound to the framework's loop, `load_function`'s cache, the eval dataset cache);
- the trace's prompts become the framework's `Sample`s, one group per trace group, fed through a
  data source (train) or an eval dataset file (eval); the framework's plug-in switches point at
  `plugins` (reward with the seed-000 hook, trajectory naming, replayed tools);
- each returned `Sample` becomes a `SampleRecord` with the framework's evidence in `details`.
  An exception out of the framework's rollout leaves `run` unchanged: that batch is lost.

In a run of many steps the adapter is the trainer side too (`update_weights`, `weights.py`): before each step it
makes the weight sync the framework's trainer makes with its engines (pause, flush, update, continue), so the
versions the replies carry are the trainer's (rollout k is served version k + 1, as slime's trainer numbers them).

Options (`job.options`): `mode` (`train`, default, or `eval`), `custom_generate_function_path`
and `custom_rm_path` (dotted paths, as the frameworks' own switches), `args` (a dict of further
framework arguments), `trace` (the trace file, for recorded tool outputs and rewards),
`source` (slime's checkout; `slime_path` is its older name).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import logging
import tempfile
from argparse import Namespace
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Iterator
from urllib.parse import urlparse

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import Emit, RolloutJob, TrajectorySpec
from bench.targets.recorded_tools import RecordedTools
from bench.trace import open_trace
from bench.trace.shipped import SHIPPED_TRACES, shipped_trace
from faults import Target

from . import patch, plugins, weights

log = logging.getLogger(__name__)

MODES = ("train", "eval")
MAX_RESUBMISSIONS = 3  # how often the rollout manager puts an aborted group back (client `stale_retry` rule)
TOOL_CALL_PARSER = "qwen25"  # SGLang's parser for `<tool_call>\n{json}\n</tool_call>`, the bench template's format
CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
_OUTCOME = {"COMPLETED": "completed", "TRUNCATED": "truncated", "ABORTED": "aborted", "FAILED": "failed"}
_OPTIONS = {"mode", "custom_generate_function_path", "custom_rm_path", "args", "trace", "slime_path", "source"}


class OptionError(ValueError):
    """A target option the adapter cannot use."""


class Args(Namespace):
    """The framework's argument namespace: a name nobody set reads as None, like an option left unset."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


@dataclass(frozen=True)
class Modules:
    """The framework modules one run uses."""

    rollout: ModuleType  # <root>.rollout.sglang_rollout
    http_utils: ModuleType
    misc: ModuleType
    types: ModuleType
    eval_config: ModuleType

    @property
    def Sample(self) -> Any:
        return self.types.Sample


class Framework:
    """What differs between slime and miles; subclasses name the framework."""

    name: ClassVar[str]
    root: ClassVar[str]
    multi_turn: ClassVar[str | None] = None  # the bundled multi-turn tool generator, if the framework has one
    weight_sync: ClassVar[weights.WeightSync] = weights.SLIME  # what its trainer sends its engines between steps

    def prepare(self, options: dict[str, Any]) -> None:
        """Make the framework importable (slime: its checkout on `sys.path`)."""

    def load(self, options: dict[str, Any]) -> Modules:
        self.prepare(options)
        names = ("rollout.sglang_rollout", "utils.http_utils", "utils.misc", "utils.types", "utils.eval_config")
        return Modules(*(importlib.import_module(f"{self.root}.{name}") for name in names))

    def version(self) -> str:
        raise NotImplementedError

    def info(self) -> dict[str, str]:
        """What the report says about the framework's code: installed version, or checkout and commit."""
        return {"framework": self.name}

    def generate_function(self, mods: Modules, path: str | None) -> plugins.InnerGenerate:
        """The generate the framework runs for one sample: its default, or the function at `path`."""
        if path is None:
            async def default(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool) -> Any:
                return await mods.rollout.generate(args, sample, sampling_params)
            return default
        function = mods.misc.load_function(path)

        async def legacy(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool) -> Any:
            if "evaluation" in inspect.signature(function).parameters:
                return await function(args, sample, sampling_params, evaluation=evaluation)
            return await function(args, sample, sampling_params)
        return legacy

    def extra_args(self, job: RolloutJob) -> dict[str, Any]:
        """Framework-specific argument names."""
        return {}

    def generate_path(self, job: RolloutJob, options: dict[str, Any]) -> str | None:
        """The generate function the run plugs in: the user's, else the bundled multi-turn one for a tool trace."""
        return options.get("custom_generate_function_path") or (self.multi_turn if uses_tools(job) else None)

    def rendered_prompt(self, tokenizer: Any, sample: Any) -> list[int] | None:
        """The prompt ids the framework's generate sends for `sample`, when it renders the prompt itself (None:
        it sends the prompt it is given, whose ids the trace holds)."""
        return None


def check_options(options: dict[str, Any]) -> None:
    unknown = set(options) - _OPTIONS
    if unknown:
        raise OptionError(f"target options: unknown {', '.join(sorted(unknown))}; known: {', '.join(sorted(_OPTIONS))}")
    if options.get("mode", "train") not in MODES:
        raise OptionError(f"target option mode: {options['mode']!r} is not one of {', '.join(MODES)}")
    for key in ("custom_generate_function_path", "custom_rm_path"):
        value = options.get(key)
        if value is not None and (not isinstance(value, str) or "." not in value):
            raise OptionError(f"target option {key}: expected a dotted path module.function, got {value!r}")
    if not isinstance(options.get("args", {}), dict):
        raise OptionError(f"target option args: expected a mapping of framework argument names, got {options['args']!r}")


def uses_tools(job: RolloutJob) -> bool:
    return any(spec.tools and spec.turns > 1 for spec in job.trajectories)


def build_args(job: RolloutJob, framework: Framework, options: dict[str, Any]) -> Args:
    """The framework's args for this job (the `--...` switches a user would pass, as attribute names)."""
    url = urlparse(job.base_url)
    if url.hostname is None or url.port is None:
        raise OptionError(f"job base_url {job.base_url!r}: expected http://host:port")
    first = job.trajectories[0].sampling_params if job.trajectories else {}
    groups = job.groups()
    values: dict[str, Any] = dict(
        hf_checkpoint=str(job.tokenizer_path),
        sglang_router_ip=url.hostname, sglang_router_port=url.port,
        sglang_server_concurrency=job.concurrency, rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_dp_size=1,
        rollout_temperature=first.get("temperature", 1.0), rollout_top_p=first.get("top_p", 1.0),
        rollout_top_k=first.get("top_k", -1), rollout_max_response_len=first.get("max_new_tokens", job.context_length),
        rollout_stop=first.get("stop"), rollout_stop_token_ids=first.get("stop_token_ids"),
        rollout_skip_special_tokens=first.get("skip_special_tokens", False),
        rollout_max_context_len=job.context_length, rollout_seed=job.seed,
        rollout_global_dataset=True, rollout_batch_size=len(groups), over_sampling_batch_size=len(groups),
        n_samples_per_prompt=max((len(m) for m in groups.values()), default=1),
        partial_rollout=False, group_rm=False, lora_rank=0, use_distributed_post=False,
        custom_rm_path=plugins.REWARD_PATH, custom_generate_function_path=plugins.GENERATE_PATH,
        input_key="prompt", metadata_key="metadata", apply_chat_template=False,
    )
    if uses_tools(job):
        values.update(generate_max_turns=max(spec.turns for spec in job.trajectories),
                      generate_tool_specs_path=plugins.TOOL_SPECS_PATH, generate_tool_call_parser=TOOL_CALL_PARSER,
                      generate_execute_tool_function_path=plugins.EXECUTE_TOOL_PATH,
                      chat_template_path=str(CHAT_TEMPLATE))
    values.update(framework.extra_args(job))
    values.update(options.get("args", {}))
    return Args(**values)


def tool_specs(job: RolloutJob) -> list[dict[str, Any]]:
    """The tools the trace's prompts announce, each once (the framework takes one list for the run)."""
    seen: dict[str, dict[str, Any]] = {}
    for spec in job.trajectories:
        for tool in spec.tools or []:
            seen.setdefault(json.dumps(tool, sort_keys=True), tool)
    return list(seen.values())


def trace_for(job: RolloutJob, options: dict[str, Any]) -> Path | None:
    """The trace file behind the job: the `trace` option, else the shipped trace holding its trajectories."""
    if options.get("trace"):
        return Path(options["trace"])
    kind = ("retool" if any(spec.raw_prompt is not None for spec in job.trajectories)
            else "agentic" if any(spec.tools for spec in job.trajectories) else "rlvr")
    for name, (_, shipped_kind, _, _) in SHIPPED_TRACES.items():
        if shipped_kind == kind:
            return shipped_trace(name)
    return None


def trace_has_tools(path: Path) -> bool:
    """Whether the trace is agentic, judged by its first trajectory (a trace is one kind throughout)."""
    with open_trace(path, check=False) as reader:
        for trajectory in reader:
            return bool(trajectory.prompt.tools) or any(turn.tool_calls for turn in trajectory.turns)
    return False


class _Feed:
    """The rollout's data source: the job's groups in order, then what the rollout manager put back."""

    def __init__(self, groups: list[list[Any]]) -> None:
        self._groups: deque[list[Any]] = deque(groups)
        self._buffer: deque[list[Any]] = deque()

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        out = []
        while len(out) < num_samples and (self._buffer or self._groups):
            out.append((self._buffer or self._groups).popleft())
        return out

    def add_samples(self, groups: list[list[Any]]) -> None:
        self._buffer.extend(groups)


@dataclass
class _Returned:
    sample: Any
    step: int
    fanout: int = 1


class SlimeFamilyTarget:
    """One slime-family framework as a bench target; `patched` applies the fixed group pattern at run time."""

    framework: ClassVar[Framework]
    variants: ClassVar[tuple[str, ...]] = ("unfixed", "patched", "fixed")  # fixed: patched, by the reference name
    fail_fast = False  # neither framework declares one trajectory's failure fatal to the batch
    # Does the rollout manager put back every group with an ABORTED sample (slime's fully-async manager does, as
    # they are, and retool's ABORTED is meant for it), or only those a `stale_retry` rule names (the default)?
    requeue_aborted: ClassVar[bool] = False

    def __init__(self, variant: str = "unfixed") -> None:
        if variant not in self.variants:
            raise ValueError(f"{self.framework.name} has variants unfixed and patched (alias fixed), not {variant!r}")
        self.patched = variant in ("patched", "fixed")
        self.name = f"{self.framework.name}:{variant}"
        self.weight_version = 0  # the trainer's counter: one more per weight sync

    async def update_weights(self, job: RolloutJob) -> str:
        """The trainer side before step `job.step`: its weight sync with the engine (the bench server), as the
        framework's trainer makes it once the weights are loaded and after every training step; the version its
        trainer published. At step 0 the trainer first joins the engine's weight-update group."""
        sync = weights.configured(self.framework.weight_sync, dict(job.options.get("args") or {}))
        if job.step == 0:  # a new run: a new trainer
            self.weight_version = 0
            await weights.connect(job.base_url, sync)
        self.weight_version += 1
        await weights.publish(job.base_url, sync, str(self.weight_version))
        return str(self.weight_version)

    def warm_up(self, options: dict[str, Any]) -> None:
        """Import the framework (miles: 7-10 s of torch and megatron) before the job arrives; the worker calls
        this while the bench loads its trace, and `load` then finds every module imported. The multi-turn
        generator (miles: ~1 s more) too, unless the run's trace has no tool calls; with no trace named
        (a warm worker, which serves any run) always."""
        check_options(options)
        self.framework.load(options)
        trace = options.get("trace")
        if self.framework.multi_turn and (trace is None or trace_has_tools(Path(trace))):
            importlib.import_module(self.framework.multi_turn.rsplit(".", 1)[0])

    def framework_info(self) -> dict[str, str]:
        """The framework's installed version, or its checkout and commit (known once `warm_up` or `run` loaded it)."""
        return self.framework.info()

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        options = dict(job.options)
        check_options(options)
        mods = await asyncio.to_thread(self.framework.load, options)
        records = await asyncio.to_thread(self._rollout, job, options, mods)
        for record in records:
            emit(record)

    # --- on a worker thread: the framework's `run` blocks it while the rollout runs on the framework's loop ---

    def _rollout(self, job: RolloutJob, options: dict[str, Any], mods: Modules) -> list[SampleRecord]:
        args = build_args(job, self.framework, options)
        if job.step == 0:  # `run --steps K`: later steps keep the process-wide state, as the framework's trainer does
            evict(mods)
        mods.http_utils.init_http_client(args)
        client = mods.http_utils._http_client
        if client is None:
            raise RuntimeError(f"{self.framework.name}: init_http_client made no client (rollout engines: 0?)")
        if plugins.name_request not in client.event_hooks["request"]:
            client.event_hooks["request"].append(plugins.name_request)
        trace = trace_for(job, options)
        recorded = RecordedTools.load(trace, job.trajectories) if trace is not None and trace.exists() else None
        inner_path = self.framework.generate_path(job, options)
        plugins.configure(plugins.Settings(
            inner_generate=self.framework.generate_function(mods, inner_path),
            inner_reward=mods.misc.load_function(options["custom_rm_path"]) if options.get("custom_rm_path") else None,
            tools=recorded, rewards=recorded.rewards if recorded else {}), tool_specs(job))
        tokenizer = mods.rollout.GenerateState(args).tokenizer
        render = functools.partial(self.framework.rendered_prompt, tokenizer)
        with patch.fixed_group(mods.rollout, render) if self.patched else contextlib.nullcontext():
            if options.get("mode", "train") == "eval":
                returned = self._eval(job, args, mods)
            else:
                returned = self._train(job, args, mods)
        by_id = {spec.id: spec for spec in job.trajectories}
        return [record_of(by_id[trajectory], found, args, tokenizer, self.framework.version(),
                          render(found.sample))
                for trajectory, found in returned.items() if trajectory in by_id]

    def _train(self, job: RolloutJob, args: Args, mods: Modules) -> dict[str, _Returned]:
        """`generate_rollout` per group size (one rollout step each), then the rollout manager's resubmissions."""
        returned: dict[str, _Returned] = {}
        step = job.step * (1 + MAX_RESUBMISSIONS)  # the rollout id: unique per call, one step after the other
        for size, groups in _by_size(job).items():
            feed = _Feed([[new_sample(mods, spec, group_index, index) for index, spec in members]
                          for group_index, members in groups])
            pending = len(groups)
            for resubmission in range(1 + MAX_RESUBMISSIONS):
                args.n_samples_per_prompt, args.rollout_batch_size, args.over_sampling_batch_size = size, pending, pending
                output = mods.rollout.generate_rollout(args, step, feed, evaluation=False)
                step += 1
                back = []
                for group in output.samples:
                    for found in _flatten(group):
                        trajectory = plugins.trajectory_of(found.sample)
                        found.step = step - 1
                        returned[trajectory] = found
                    if any(self.requeue_aborted and _requeued(s.sample) or _resubmits(job, s.sample)
                           for s in _flatten(group)):
                        back.append(group)
                if not back or resubmission == MAX_RESUBMISSIONS:
                    break
                log.info("%s: %d aborted group(s) go back to the data source with their samples as they are",
                         self.framework.name, len(back))
                for group in back:
                    for sample in group:
                        if isinstance(sample, list):
                            raise RuntimeError("cannot resubmit a fanned-out group (generate_multi_samples)")
                feed.add_samples(back)
                pending = len(back)
        return returned

    def _eval(self, job: RolloutJob, args: Args, mods: Modules) -> dict[str, _Returned]:
        """`generate_rollout(..., evaluation=True)` over one eval dataset file per group size."""
        with tempfile.TemporaryDirectory(prefix="rollout-bench-eval-") as folder:
            configs = []
            for size, groups in _by_size(job).items():
                path = Path(folder) / f"groups-of-{size}.jsonl"
                with path.open("w") as out:
                    for position, (_, members) in enumerate(groups):
                        entry = {"group": members[0][1].group, "members": [spec.id for _, spec in members],
                                 "first_index": position * size}
                        out.write(json.dumps({"prompt": framework_prompt(members[0][1]),
                                              "metadata": {plugins.META_KEY: entry}}) + "\n")
                configs.append(eval_dataset(mods, args, f"rollout-bench-{size}", path, size))
            args.eval_datasets = configs
            output = mods.rollout.generate_rollout(args, 0, None, evaluation=True)
        returned: dict[str, _Returned] = {}
        for result in output.data.values():
            for sample in result["samples"]:
                returned[plugins.trajectory_of(sample)] = _Returned(sample, 0)
        return returned


def evict(mods: Modules) -> None:
    """Drop the process-wide state a previous rollout left: the first args would win, the old loop's client would be reused."""
    state_class = mods.rollout.GenerateState
    state_class._instances.pop(state_class, None)
    mods.http_utils._http_client = None
    cache_clear = getattr(mods.misc.load_function, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
    getattr(mods.rollout, "EVAL_PROMPT_DATASET", {}).clear()


def framework_prompt(spec: TrajectorySpec) -> str:
    """The prompt the framework receives: the raw one when it renders its own (the trace's `prompt.raw`), else
    the rendered text (slime's default generate tokenizes it as it is)."""
    return spec.raw_prompt if spec.raw_prompt is not None else spec.prompt_text


def new_sample(mods: Modules, spec: TrajectorySpec, group_index: int, index: int) -> Any:
    return mods.Sample(group_index=group_index, index=index, prompt=framework_prompt(spec),
                       metadata={plugins.META_KEY: {"trajectory": spec.id, "group": spec.group}})


def eval_dataset(mods: Modules, args: Args, name: str, path: Path, size: int) -> Any:
    """An `EvalDatasetConfig` for one file, with the run's sampling parameters (fields the version lacks are left out)."""
    config_class = mods.eval_config.EvalDatasetConfig
    wanted = dict(name=name, path=str(path), input_key=args.input_key, metadata_key=args.metadata_key,
                  n_samples_per_eval_prompt=size, temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                  top_k=args.rollout_top_k, max_response_len=args.rollout_max_response_len,
                  stop=args.rollout_stop, stop_token_ids=args.rollout_stop_token_ids)
    known = {f.name for f in fields(config_class)}
    return config_class(**{k: v for k, v in wanted.items() if k in known})


def _by_size(job: RolloutJob) -> dict[int, list[tuple[int, list[tuple[int, TrajectorySpec]]]]]:
    """Groups by size (the framework's `n_samples_per_prompt` is one number per rollout), with global indices."""
    out: dict[int, list[tuple[int, list[tuple[int, TrajectorySpec]]]]] = {}
    index = 0
    for group_index, members in enumerate(job.groups().values()):
        out.setdefault(len(members), []).append((group_index, [(index + k, spec) for k, spec in enumerate(members)]))
        index += len(members)
    return out


def _flatten(group: list[Any]) -> Iterator[_Returned]:
    for item in group:
        if isinstance(item, list):  # a generate function that fans one sample out into several
            if item:
                yield _Returned(item[-1], 0, fanout=len(item))
        else:
            yield _Returned(item, 0)


def _requeued(sample: Any) -> bool:
    """An ABORTED sample a requeueing manager puts back; not a patched run's placeholder for a sample that raised
    (it stands in to be trained as removed, with the error that made it)."""
    return sample.status.name == "ABORTED" and patch.ERROR_KEY not in (sample.metadata or {})


def _resubmits(job: RolloutJob, sample: Any) -> bool:
    """Does the rollout manager put this sample back? An ABORTED one, when a `stale_retry` rule fires for its abort."""
    if sample.status.name != "ABORTED":
        return False
    trajectory = plugins.trajectory_of(sample)
    where = plugins.aborted_at(trajectory)
    if where is None:
        return False
    group = (sample.metadata or {}).get(plugins.META_KEY, {}).get("group")
    target = Target(trajectory, None, group, where[0], where[1], "/generate")
    return any(rule.fault.name == "stale_retry" and rule.schedule.fires(job.seed, rule.name, target, 0.0)
               for rule in job.client_faults)


def split_tokens(tokens: list[int], response_length: int, prompt: list[int]) -> tuple[int, list[int], bool]:
    """(prompt length, response ids, whether `tokens` starts with `prompt`) of a Sample's token list.

    `prompt` is what the framework renders for the sample: when the tokens start with it, the response is
    everything after it (so a response that disagrees with `response_length` shows). When they do not (a
    placeholder built from another rendering, a sample with no tokens yet), the Sample's own split stands:
    its last `response_length` tokens. The ids always come from the Sample, never from a recorded length."""
    if not tokens:
        return len(prompt), [], False
    if tokens[: len(prompt)] == prompt:
        return len(prompt), tokens[len(prompt):], True
    kept = min(max(response_length, 0), len(tokens))
    return len(tokens) - kept, tokens[len(tokens) - kept:], False


def record_of(spec: TrajectorySpec, found: _Returned, args: Args, tokenizer: Any, version: str,
              rendered: list[int] | None = None) -> SampleRecord:
    """A framework `Sample` as the trainer would receive it, with the framework's own evidence in `details`.
    `rendered`: the prompt ids the framework rendered for it, if it renders its own (else the trace's)."""
    sample = found.sample
    status = sample.status.name
    tokens = list(sample.tokens or [])
    sent_prompt = list(spec.prompt_ids) if rendered is None else list(rendered)
    prompt_length, response_ids, prompt_found = split_tokens(tokens, sample.response_length, sent_prompt)
    loss_mask = [1] * sample.response_length if sample.loss_mask is None else list(sample.loss_mask)
    if getattr(sample, "remove_sample", False):
        loss_mask = [0] * len(loss_mask)  # what the trainer does with a removed sample
    reward = sample.reward
    if isinstance(reward, dict):
        reward = reward.get(args.reward_key) if args.reward_key else None
    try:
        sample.validate()
        validated = "ok"
    except AssertionError as error:
        validated = f"AssertionError: {error}"
    except AttributeError:
        validated = "not available"
    stored_error = (sample.metadata or {}).get(patch.ERROR_KEY)
    error = ErrorInfo(**stored_error) if stored_error else None
    outcome = _OUTCOME.get(status)
    if outcome is None:  # PENDING: handed back without a finish status; it would be trained on as it is
        outcome = "failed"
        error = error or ErrorInfo("Pending", f"the rollout returned the sample with status {status}", "")
    details = {
        "framework": version, "status": status, "validate": validated,
        "loss_mask": "unset (trainer uses all ones)" if sample.loss_mask is None else "set",
        "remove_sample": bool(getattr(sample, "remove_sample", False)),
        "response_text_tokens": len(tokenizer.encode(sample.response or "", add_special_tokens=False)),
        "prompt_matches_trace": tokens[:len(spec.prompt_ids)] == list(spec.prompt_ids),
        "prompt_found_in_tokens": prompt_found,
        "rollout_step": found.step, "generate_calls": plugins.settings().generate_calls.get(spec.id, 0),
    }
    if found.fanout > 1:
        details["fanout"] = found.fanout
    return SampleRecord(
        trajectory=spec.id, group=spec.group, outcome=outcome, status=status, prompt_length=prompt_length,
        response_ids=response_ids,
        logprobs=None if sample.rollout_log_probs is None else [float(x) for x in sample.rollout_log_probs],
        loss_mask=loss_mask, response_length=sample.response_length,
        reward=None if reward is None else float(reward),
        weight_versions=[str(v) for v in sample.weight_versions or []], error=error, details=details)

