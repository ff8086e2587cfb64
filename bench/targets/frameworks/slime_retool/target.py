"""`slime-retool`: slime's retool example (`examples/retool/generate_with_retool.py`) as slime's generate function,
from the same checkout as slime (`--source DIR`), against the bench server.

Why a target of its own rather than `--custom-generate-function-path` on `slime`: retool is not a plug-in a
trace of the bench's own template can drive. It receives the dataset's raw question and renders its own
prompt (its system prompt and its one tool, `code_interpreter`), parses only its own tool calls, and runs the
code in its own sandbox. So this target
- feeds each sample the trace's raw prompt (`prompt.raw`; the shipped `retool-64` trace has one, `rollout-bench
  synth --kind retool` makes more) and refuses, naming the first trajectory, a trace whose rendered prompt is
  not what this checkout's retool renders from it (requests would drift from turn 0);
- lets retool's own sandbox run every tool call (a Python process per call; it blocks slime's event loop for
  the length of the call, as it does in training); the `oversized_tool_output` fault speaks its protocol (a
  `code_interpreter` call printing N bytes) so the oversized output comes from retool's own tool path;
- takes response ids from the Sample retool returns, split at the prompt retool itself renders (never at a
  length read from the trace);
- names `max_tokens_per_gpu` and `context_parallel_size` (retool reads them when no context length is set);
- puts every group with an ABORTED sample back, its Sample objects as they are, as slime's fully-async rollout
  manager does (retool's ABORTED is meant for it): a retried sample arrives with its first attempt's state.

Everything else (args, data source, rollout manager resubmissions, variants unfixed/patched, options) is the
slime family's (`slime/family.py`); the environment is slime's (`make slime-env`).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar

from bench.targets.base import RolloutJob
from bench.trace import open_trace

from ..slime.family import Modules, OptionError, SlimeFamilyTarget
from ..slime.target import Slime

EXAMPLE = "examples/retool"
GENERATE_MODULE = "generate_with_retool"
SANDBOX_MODULE = "tool_sandbox"
DEFAULT_TRACE = "retool-64"


class SlimeRetool(Slime):
    name = "slime-retool"
    multi_turn = f"{GENERATE_MODULE}.generate"

    def prepare(self, options: dict[str, Any]) -> None:
        super().prepare(options)
        assert self.checkout is not None
        folder = self.checkout.path / EXAMPLE
        if not (folder / f"{GENERATE_MODULE}.py").is_file():
            raise OptionError(f"slime source {str(self.checkout.path)!r}: no {EXAMPLE}/{GENERATE_MODULE}.py there "
                              "(the retool example); give a slime checkout that has it")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))

    def load(self, options: dict[str, Any]) -> Modules:
        mods = super().load(options)
        importlib.import_module(GENERATE_MODULE)  # retool imports slime's rollout module: after it, as a user's would
        return mods

    def version(self) -> str:
        return super().version().replace("slime", "slime retool", 1)

    def extra_args(self, job: RolloutJob) -> dict[str, Any]:
        return {**super().extra_args(job), "max_tokens_per_gpu": job.context_length, "context_parallel_size": 1}

    def generate_path(self, job: RolloutJob, options: dict[str, Any]) -> str | None:
        return options.get("custom_generate_function_path") or self.multi_turn

    def rendered_prompt(self, tokenizer: Any, sample: Any) -> list[int] | None:
        """What retool sends for this sample's prompt: its own template around the raw question, tokenized as
        retool tokenizes it (both by retool's own functions)."""
        retool = sys.modules[GENERATE_MODULE]
        text = retool.format_conversation_with_tools(prompt=sample.prompt, tools=retool.tool_registry.get_tool_specs())
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class SlimeRetoolTarget(SlimeFamilyTarget):
    framework: ClassVar[SlimeRetool] = SlimeRetool()  # type: ignore[assignment]
    # retool returns ABORTED "so the fully_async rollout manager returns the whole group to the buffer for retry"
    # (its own comment, #1861); slime's fully-async manager (an example at 41dc3b6, a module at 624b824) puts every
    # group with an ABORTED sample back into the data buffer, Sample objects as they are.
    requeue_aborted = True

    def warm_up(self, options: dict[str, Any]) -> None:
        """Refuse, before anything runs, a trace that cannot drive retool: one without raw prompts."""
        trace = options.get("trace")
        if trace is not None:
            check_raw_prompts(Path(trace))
        super().warm_up(options)

    def _rollout(self, job: RolloutJob, options: dict[str, Any], mods: Modules) -> list[Any]:
        check_rendering(job, self.framework, mods)
        return super()._rollout(job, options, mods)


def check_raw_prompts(trace: Path) -> None:
    """The trace's first trajectory must carry a raw prompt (a trace is one kind throughout)."""
    with open_trace(trace, check=False) as reader:
        for trajectory in reader:
            if trajectory.prompt.raw is None:
                raise OptionError(f"trace {str(trace)!r}: trajectory {trajectory.id} has no raw prompt (prompt.raw): "
                                  f"retool renders its own prompt around the raw question; use a retool trace "
                                  f"(--trace {DEFAULT_TRACE}, or `rollout-bench synth --kind retool`)")
            return


def check_rendering(job: RolloutJob, framework: SlimeRetool, mods: Modules) -> None:
    """Refuse a trace whose prompts retool would render differently: every request would drift from turn 0."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
    for spec in job.trajectories:
        if spec.raw_prompt is None:
            raise OptionError(f"trajectory {spec.id}: the trace has no raw prompt (prompt.raw): retool renders its "
                              f"own prompt around the raw question; use a retool trace ({DEFAULT_TRACE}, or "
                              "`rollout-bench synth --kind retool`)")
        sample = mods.Sample(prompt=spec.raw_prompt)
        if framework.rendered_prompt(tokenizer, sample) != list(spec.prompt_ids):
            raise OptionError(f"trajectory {spec.id}: retool at {framework.version()} renders its raw prompt to "
                              "other ids than the trace's prompt.ids (a trace made for another retool template)")
