"""verifiers `RolloutOutput` dicts as sample records: pure functions, no verifiers import.

The record names the requests it holds (`request_ids`, from each step's response id): prime-rl starts a new
training sample where a step's prompt stops extending the previous one; this record is the first of those.

A verifiers 0.1 rollout never raises: its error is caught into the state and serialized as
`{"error", "error_chain_repr", "error_chain_str"}` (the live class is lost at that boundary),
and its tokens live in the trajectory steps (`tokens`: prompt/completion ids, completion
mask and logprobs, or `None` when the server's answer lacked vLLM's token fields). A
multi-turn rollout is one training sample the way prime-rl builds it: each step's prompt
extends the previous prompt and completion with the environment's tokens (tool output,
loss mask 0, logprob 0.0), followed by the step's completion (mask 1, its logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import TrajectorySpec


@dataclass
class Assembled:
    """The response of a rollout as one token sequence, plus what did not fit that picture."""

    prompt_length: int | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    steps_without_tokens: int = 0
    prefix_mismatch_step: int | None = None  # a step whose prompt does not extend the sequence so far
    request_ids: list[str] = field(default_factory=list)  # the server's ids of the steps the sample holds


def assemble(steps: Sequence[Mapping[str, Any]]) -> Assembled:
    """Concatenate trajectory steps into prompt + response; stops at a step that breaks the prefix."""
    out = Assembled()
    sequence: list[int] | None = None
    for index, step in enumerate(steps):
        tokens = step.get("tokens")
        if tokens is not None and sequence is not None and list(tokens["prompt_ids"])[: len(sequence)] != sequence:
            out.prefix_mismatch_step = index
            break
        request_id = _request_id(step)
        if request_id is not None:
            out.request_ids.append(request_id)
        if tokens is None:
            out.steps_without_tokens += 1
            out.logprobs = None  # text without token ids: nothing trainable was returned for this step
            continue
        prompt, completion = list(tokens["prompt_ids"]), list(tokens["completion_ids"])
        if sequence is None:
            out.prompt_length, sequence = len(prompt), prompt
        else:
            extra = prompt[len(sequence):]
            out.ids += extra
            out.mask += [0] * len(extra)
            if out.logprobs is not None:
                out.logprobs += [0.0] * len(extra)
            sequence = prompt
        out.ids += completion
        out.mask += list(tokens["completion_mask"])
        if out.logprobs is not None:
            out.logprobs += [float(x) for x in tokens["completion_logprobs"]]
        sequence = sequence + completion
    return out


def _request_id(step: Mapping[str, Any]) -> str | None:
    """The request id the server gave the step's answer (vLLM prefixes `chatcmpl-`; the bench logs it bare)."""
    response = step.get("response")
    found = response.get("id") if isinstance(response, Mapping) else getattr(response, "id", None)
    return found.removeprefix("chatcmpl-") if isinstance(found, str) else None


def outcome_of(output: Mapping[str, Any]) -> str:
    """failed when the rollout recorded an error, truncated when verifiers says so, else completed."""
    if output.get("error"):
        return "failed"
    return "truncated" if output.get("is_truncated") else "completed"


def error_info(error: Mapping[str, Any] | None) -> ErrorInfo | None:
    """The serialized error as the bench's `ErrorInfo`: class, repr chain, type chain."""
    if not error:
        return None
    return ErrorInfo(str(error.get("error")), str(error.get("error_chain_repr")), str(error.get("error_chain_str")))


def record_of(output: Mapping[str, Any], spec: TrajectorySpec, *, details: dict[str, Any]) -> SampleRecord:
    """One rollout's output as a sample record; `details` gets the evidence verifiers-specific readers need."""
    steps = list(output.get("trajectory") or [])
    tokens = assemble(steps)
    details = {
        **details,
        "error": dict(output["error"]) if output.get("error") else None,  # the serialized dict, untouched
        "stop_condition": output.get("stop_condition"),
        "is_completed": output.get("is_completed"),
        "is_truncated": output.get("is_truncated"),
        "steps": len(steps),
        "steps_without_tokens": tokens.steps_without_tokens,
        "prefix_mismatch_step": tokens.prefix_mismatch_step,
    }
    reward = output.get("reward")
    return SampleRecord(
        trajectory=spec.id, group=spec.group, outcome=outcome_of(output),
        status=str(output.get("stop_condition")) if output.get("stop_condition") else None,
        prompt_length=tokens.prompt_length if tokens.prompt_length is not None else len(spec.prompt_ids),
        response_ids=tokens.ids, logprobs=tokens.logprobs, loss_mask=tokens.mask, response_length=len(tokens.ids),
        reward=None if reward is None else float(reward), error=error_info(output.get("error")), details=details,
        request_ids=tokens.request_ids,  # a sample cut at a prefix mismatch holds only the steps before it
    )
