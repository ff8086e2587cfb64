"""`ref-tool-loop`: a multi-turn tool-calling rollout in the shape of slime's retool example (seed mode 004).

One trajectory is a loop over turns (at most the recorded count, `spec.turns`): POST
`/generate` with the prompt plus everything so far, append the reply's tokens (loss mask 1,
its logprobs), parse the `<tool_call>` blocks of the reply text, run the tools, append the
tool message the chat template renders (loss mask 0, logprob 0.0), go on. The loop stops when
the model calls no tool, a turn ends with `length` or `abort`, or the context is full.

The rollout manager around it resubmits an ABORTED sample object (the same object, as
slime's buffer does) when the client-side `stale_retry` rule fires for the aborted attempt;
otherwise the sample is kept as an ABORTED placeholder (loss mask zeroed, reward 0).

Tools are not run: `RecordedTools` (`bench.targets.recorded_tools`) answers each call with the output recorded in the trace
for that turn, so the next request is the recorded one and the replay keeps matching; the
`oversized_tool_output` fault's command (`faults.hooks.emit_command(n)`) yields exactly n
bytes of "x" (parsed, never given to a shell).

- `unfixed` (slime#1861 before the fix), four ways to desync tokens, logprobs and loss mask:
  (1) a resubmitted sample keeps the previous attempt's accumulated fields (response ids,
      logprobs, loss mask) and the loop appends onto them, while the requests and
      `response_length` come from this call's fresh token list;
  (2) every turn asks for the first turn's `max_new_tokens`, however little context is left
      (against a server whose context is the budget, that is SGLang's context-length 400);
  (3) a reply without `output_token_logprobs` is retokenized from its text: tokens and loss
      mask grow, logprobs do not;
  (4) tool output is appended untrimmed, so a large one carries the sample past the context.
- `fixed` (the patch): clears the sample's fields on entry, clamps `max_new_tokens` to
  `context_length - current length`, marks a turn without logprobs ABORTED, and trims the
  tool message to the budget (ids, mask and logprobs together) and marks the sample TRUNCATED.

Outside this seed's subject and the same in both variants: an HTTP error ends its
trajectory as `failed` with the error kept (the rest of the batch goes on), and no request is
retried by the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.records.sample import ErrorInfo, SampleRecord
from bench.tokenizer import ByteBPETokenizer, load_tokenizer
from bench.trace.shipped import shipped_trace
from faults import Rule, Target

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import generate, output_of
from ..recorded_tools import RecordedTools
from . import ReferenceTarget

log = logging.getLogger(__name__)

DEFAULT_TRACE = "agentic-500"
MAX_RESUBMISSIONS = 3  # the rollout manager gives an aborted sample this many more tries

PENDING, COMPLETED, TRUNCATED, ABORTED = "PENDING", "COMPLETED", "TRUNCATED", "ABORTED"
_OUTCOME = {COMPLETED: "completed", TRUNCATED: "truncated", ABORTED: "aborted"}

_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The `<tool_call>\\n{json}\\n</tool_call>` blocks of a reply, in order; unparsable ones are skipped."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments")
            calls.append({"name": call["name"], "arguments": arguments if isinstance(arguments, dict) else {}})
    return calls


def tool_message(outputs: list[str]) -> str:
    """What the chat template appends after a tool-calling turn (as `bench.synth.agentic` records it)."""
    return "".join(f"\n<|im_start|>user\n<tool_response>\n{out}\n</tool_response><|im_end|>" for out in outputs) \
        + "\n<|im_start|>assistant\n"


@dataclass
class Sample:
    """The framework's sample object: it travels through the rollout manager and back on a retry."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    loss_mask: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    status: str = PENDING
    weight_versions: list[str] = field(default_factory=list)
    aborted_at: tuple[int, int] | None = None  # (turn, attempt) of the request that ended in an abort
    note: str | None = None
    requests: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # turn -> requests made

    def reset(self) -> None:
        """The fix (1): a resubmitted sample starts clean."""
        self.response_ids, self.rollout_log_probs, self.loss_mask = [], None, []
        self.response, self.response_length = "", 0
        self.weight_versions, self.aborted_at, self.note = [], None, None


class RefToolLoop(ReferenceTarget):
    family = "ref-tool-loop"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        trace = job.options.get("trace") or shipped_trace(DEFAULT_TRACE)
        tools = await asyncio.to_thread(RecordedTools.load, trace, job.trajectories)
        tokenizer = load_tokenizer()
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            loop = _Loop(self.fixed, job, http, limit, tokenizer, tools)
            await asyncio.gather(*(self._trajectory(loop, spec, emit) for spec in job.trajectories))

    async def _trajectory(self, loop: "_Loop", spec: TrajectorySpec, emit: Emit) -> None:
        """The rollout manager's view of one trajectory: generate, resubmit an aborted sample, keep the result."""
        sample = Sample(list(spec.prompt_ids))
        try:
            for _ in range(1 + MAX_RESUBMISSIONS):
                await loop.generate(spec, sample)
                if sample.status != ABORTED or not loop.resubmits(spec, sample):
                    break
                log.info("%s: aborted at turn %d, attempt %d; resubmitting the sample", spec.id, *sample.aborted_at)
                sample.status = PENDING  # the same object goes back in, with whatever it carries
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as error:
            log.error("trajectory %s failed", spec.id, exc_info=error)
            emit(SampleRecord(trajectory=spec.id, group=spec.group, outcome="failed", status="FAILED",
                              prompt_length=len(spec.prompt_ids), reward=0.0, error=ErrorInfo.of(error)))
            return
        emit(_record(spec, sample, loop.tools.rewards.get(spec.id)))


class _Loop:
    """The custom generate function (slime's `generate(args, sample, sampling_params)`), one job's worth."""

    def __init__(self, fixed: bool, job: RolloutJob, http: aiohttp.ClientSession, limit: asyncio.Semaphore,
                 tokenizer: ByteBPETokenizer, tools: RecordedTools) -> None:
        self.fixed, self.job, self.http, self.limit = fixed, job, http, limit
        self.tokenizer, self.tools = tokenizer, tools
        self.stale_retry: list[Rule] = [r for r in job.client_faults if r.fault.name == "stale_retry"]

    def resubmits(self, spec: TrajectorySpec, sample: Sample) -> bool:
        """Does the rollout manager put this aborted sample back? The `stale_retry` rule decides, per attempt."""
        if sample.aborted_at is None:
            return False
        turn, attempt = sample.aborted_at
        target = Target(spec.id, None, spec.group, turn, attempt, "/generate")
        for rule in self.stale_retry:
            if rule.schedule.fires(self.job.seed, rule.name, target, 0.0):
                if not getattr(rule.fault, "keep_tokens", True):
                    sample.response_ids = []  # the manager cleared the tokens, not the rest
                return True
        return False

    async def generate(self, spec: TrajectorySpec, sample: Sample) -> None:
        if self.fixed:
            sample.reset()  # fix (1)
        budget = self.job.context_length
        prompt = spec.prompt_ids
        ids: list[int] = []  # this call's response ids: what every request carries after the prompt
        finish = None
        for turn in range(spec.turns):
            total = len(prompt) + len(ids)
            if total >= budget:
                sample.status = TRUNCATED
                break
            params = dict(spec.sampling_params)
            if self.fixed:  # fix (2): never ask for more than the context leaves
                params["max_new_tokens"] = min(params.get("max_new_tokens", budget - total), budget - total)
            sample.requests[turn] += 1
            async with self.limit:
                body = await generate(self.http, self.job.base_url, spec, prompt + ids, params)
            out_ids, logprobs, text, finish = output_of(body)
            sample.weight_versions.append(str(body["meta_info"].get("weight_version")))
            if finish == "abort":
                sample.status, sample.aborted_at = ABORTED, (turn, sample.requests[turn])
                break
            if logprobs is None:
                if self.fixed:  # fix (3): no logprobs, no training on this sample
                    sample.status, sample.aborted_at = ABORTED, (turn, sample.requests[turn])
                    sample.note = f"turn {turn}: answer without output_token_logprobs"
                    break
                out_ids = self.tokenizer.encode(text)  # the old fallback: retokenize the text
            ids += out_ids
            sample.response_ids += out_ids
            if logprobs is not None:
                sample.rollout_log_probs = (sample.rollout_log_probs or []) + logprobs
            sample.loss_mask += [1] * len(out_ids)
            sample.response += text
            if finish == "length":
                break
            calls = parse_tool_calls(text)
            if not calls:
                break  # the model is done calling tools
            message = tool_message([self.tools.run(spec.id, turn, call) for call in calls])
            observation = self.tokenizer.encode(message)
            overflow = len(prompt) + len(ids) + len(observation) - budget
            if self.fixed and overflow > 0:  # fix (4): trim the tool output to the budget
                observation = observation[: len(observation) - overflow]
                message = self.tokenizer.decode(observation)
            ids += observation
            sample.response_ids += observation
            sample.loss_mask += [0] * len(observation)
            if sample.rollout_log_probs is not None:
                sample.rollout_log_probs += [0.0] * len(observation)
            sample.response += message
            if self.fixed and overflow > 0:
                sample.status = TRUNCATED
                sample.note = f"turn {turn}: tool output trimmed by {overflow} tokens to fit the context"
                break
        sample.response_length = len(ids)
        if sample.status == PENDING:
            sample.status = {"length": TRUNCATED, "abort": ABORTED}.get(finish or "stop", COMPLETED)


def _record(spec: TrajectorySpec, sample: Sample, recorded_reward: float | None) -> SampleRecord:
    """The sample as the trainer would get it; an ABORTED sample is kept with its loss masked out."""
    aborted = sample.status == ABORTED
    reward = (recorded_reward or 0.0) if sample.status == COMPLETED else 0.0
    return SampleRecord(
        trajectory=spec.id, group=spec.group, outcome=_OUTCOME[sample.status], status=sample.status,
        prompt_length=len(spec.prompt_ids), response_ids=list(sample.response_ids),
        logprobs=None if sample.rollout_log_probs is None else list(sample.rollout_log_probs),
        loss_mask=[0] * len(sample.loss_mask) if aborted else list(sample.loss_mask),
        response_length=sample.response_length, reward=reward, weight_versions=list(sample.weight_versions),
        error=ErrorInfo("Aborted", sample.note, "") if aborted and sample.note else None,
    )
