"""`ref-scheduler`: a continuous-batching group scheduler in the shape of prime-rl's (seed mode 003).

The pattern (prime-rl `orchestrator/scheduler.py` over verifiers): the scheduler keeps one task
per in-flight *group rollout*, waits for the first to finish, and reschedules a replacement
group when a finished group carries errored rollouts. Rollouts never raise: like verifiers,
a rollout catches its error and records it in its state as a serialized dict, because the
state crosses a process boundary where the live exception class is lost:

    {"error": "ModelError",
     "error_chain_repr": "ModelError() -> InternalServerError('No available workers (all circuits open or unhealthy)')",
     "error_chain_str": "ModelError -> InternalServerError",
     "is_retryable": false}

`is_retryable` is decided on the rollout side (verifiers#1427), where the live exception is
still known: a rate limit or a dropped connection is a per-request blip worth a new attempt;
an error status saying the serving fleet is down (the router's 503 "No available workers") is
not, and neither is anything unrecognised.

- `unfixed`: reschedules every errored group, whatever the error. During a router outage every
  replacement fails at once and is replaced again: a retry storm (in prime-rl, churn of
  replacement SWE sandboxes) that only ends when the outage does. The bench stops it after
  `MAX_RESCHEDULES` replacements (a safety valve standing in for the end of the outage, not
  part of the pattern) and reports the trajectories still failing as failed.
- `fixed` (prime-rl#2579): reschedules a group only if every error in it is marked
  `is_retryable: true`, at most `MAX_GROUP_RETRIES` times. A terminal error drops the group
  (its trajectories are reported failed, with the error) and raises a plain `RuntimeError`
  naming the root cause out of the scheduler: the batch fails fast and loudly.

The bench replays the same example in a replacement group (prime-rl samples a new one) so
that every trajectory ends in exactly one record. The rollout is one model call (turn 0),
sent to the server's SGLang `/generate` (where the fault plan acts) with the trajectory named
in `X-Bench-Trajectory`; an HTTP error becomes a look-alike of the OpenAI SDK's exception class
for its status (`RateLimitError`, `InternalServerError`, ...; the SDK itself is not a core
dependency), with no client-side retries, so every retry is the scheduler's and shows in the
server's request log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import aiohttp

from bench.records.attribution import TRAJECTORY_HEADER
from bench.records.sample import ErrorInfo, SampleRecord
from faults.hooks import raise_if_poisoned

from ..base import Emit, RolloutJob, TrajectorySpec
from ..client import output_of
from . import ReferenceTarget

log = logging.getLogger(__name__)
_OUTCOME = {"stop": "completed", "length": "truncated", "abort": "aborted"}

MAX_RESCHEDULES = 64  # unfixed: bench safety valve on replacement groups (job.options["max_reschedules"])
MAX_GROUP_RETRIES = 3  # fixed: replacements per group for retryable errors (job.options["max_group_retries"])


# The OpenAI SDK's view of an HTTP answer (status -> class), then verifiers' wrapper.
class APIError(Exception):
    """A failed model call, as the OpenAI SDK raises it."""


class APIStatusError(APIError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class BadRequestError(APIStatusError):
    pass


class RateLimitError(APIStatusError):
    pass


class InternalServerError(APIStatusError):
    pass


class APIConnectionError(APIError):
    pass


class ModelError(Exception):
    """verifiers: every model-call failure reaches the rollout state wrapped in this."""


_RETRYABLE = (RateLimitError, APIConnectionError)  # transient, per request


def status_error(status: int, body: bytes) -> APIStatusError:
    """The SDK's exception for an error answer; the message is the body's own when it has one."""
    cls = {400: BadRequestError, 429: RateLimitError}.get(status, InternalServerError if status >= 500
                                                         else APIStatusError)
    message = f"Error code: {status}"
    text = body.decode("utf-8", "replace").strip()
    if text:
        try:
            parsed = json.loads(text)
        except ValueError:
            message = text
        else:
            error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
            message = str(error.get("message", error) if isinstance(error, dict) else error)
    return cls(message, status)


def serialize_error(error: BaseException) -> dict[str, Any]:
    """verifiers' `ErrorInfo` dict for a rollout error, with the retry decision made here (verifiers#1427)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return {
        "error": type(error).__name__,
        "error_chain_repr": " -> ".join(repr(e) for e in chain),
        "error_chain_str": " -> ".join(type(e).__name__ for e in chain),
        "is_retryable": any(isinstance(e, _RETRYABLE) for e in chain),
    }


def is_reschedulable(error: Mapping[str, Any]) -> bool:
    """prime-rl#2579: reschedule only what verifiers marked retryable; no flag means terminal."""
    return error.get("is_retryable") is True


@dataclass
class RolloutState:
    spec: TrajectorySpec
    record: SampleRecord | None = None
    error: dict[str, Any] | None = None  # serialized, as it crosses the verifiers -> prime-rl boundary


class RefScheduler(ReferenceTarget):
    family = "ref-scheduler"

    def __init__(self, variant: str = "unfixed") -> None:
        super().__init__(variant)
        self.fail_fast = self.fixed  # the fix's declared policy: a terminal error fails the batch loudly

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        limit = asyncio.Semaphore(job.concurrency)
        async with aiohttp.ClientSession() as http:
            await schedule_groups(job, lambda members: self._generate_group(http, limit, job, members), emit,
                                  fixed=self.fixed)

    async def _generate_group(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                              members: list[TrajectorySpec]) -> list[RolloutState]:
        return list(await asyncio.gather(*(self._rollout(http, limit, job, spec) for spec in members)))

    async def _rollout(self, http: aiohttp.ClientSession, limit: asyncio.Semaphore, job: RolloutJob,
                       spec: TrajectorySpec) -> RolloutState:
        """One rollout, verifiers-style: its error is caught and serialized into the state."""
        state = RolloutState(spec)
        try:
            try:
                async with limit:
                    body = await _call_model(http, job.base_url, spec)
                ids, logprobs, text, finish = output_of(body)
            except APIError as error:
                raise ModelError() from error
            except (KeyError, TypeError, ValueError) as error:
                raise ModelError() from APIError(f"malformed response: {error!r}")
            raise_if_poisoned(text)  # post-processing: parse the reply, score it
        except Exception as error:  # noqa: BLE001 - a rollout records its error, it never raises
            state.error = serialize_error(error)
            return state
        state.record = SampleRecord(
            trajectory=spec.id, group=spec.group, outcome=_OUTCOME.get(finish, "failed"), status=finish.upper(),
            prompt_length=len(spec.prompt_ids), response_ids=ids, logprobs=logprobs, loss_mask=[1] * len(ids),
            response_length=len(ids), reward=1.0 if finish == "stop" else 0.0,
            weight_versions=[str(body["meta_info"].get("weight_version"))],
        )
        return state


GenerateGroup = Callable[[list[TrajectorySpec]], Awaitable[list[RolloutState]]]


def reschedules(error: Mapping[str, Any], fixed: bool) -> bool:
    """The scheduler's decision on one serialized rollout error: worth a replacement group?

    unfixed (prime-rl before #2579): every error is. fixed (#2579): only one verifiers marked
    `is_retryable: true` (verifiers#1427); a dict without the flag is terminal.
    """
    return is_reschedulable(error) if fixed else True


async def schedule_groups(job: RolloutJob, generate_group: GenerateGroup, emit: Emit, *, fixed: bool) -> dict[str, int]:
    """The continuous-batching loop over `job`'s groups; returns the replacement groups scheduled per group.

    `generate_group(members)` runs one group rollout and returns one state per member; an
    errored member carries its serialized error (and may carry a failed record to report).
    """
    groups = job.groups()
    max_reschedules = int(job.options.get("max_reschedules", MAX_RESCHEDULES))
    max_group_retries = int(job.options.get("max_group_retries", MAX_GROUP_RETRIES))
    inflight: dict[asyncio.Task[list[RolloutState]], str] = {}
    replacements: dict[str, int] = {group: 0 for group in groups}

    def schedule(group: str) -> None:
        task = asyncio.create_task(generate_group(groups[group]), name=f"group rollout {group}")
        inflight[task] = group

    for group in groups:
        schedule(group)
    try:
        while inflight:
            done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = inflight.pop(task)
                states = task.result()
                errors = [s.error for s in states if s.error is not None]
                if not errors:
                    for state in states:
                        emit(state.record)  # type: ignore[arg-type]
                    continue
                if not fixed:
                    # every error is treated as worth a replacement group
                    if sum(replacements.values()) < max_reschedules:
                        replacements[group] += 1
                        schedule(group)
                    else:
                        log.warning("group %s: bench cap of %d replacement groups reached; reporting it "
                                    "failed", group, max_reschedules)
                        _report_failed(states, emit)
                    continue
                terminal = [e for e in errors if not reschedules(e, fixed)]
                if not terminal and replacements[group] < max_group_retries:
                    log.info("group %s: retryable error, scheduling a replacement: %s", group,
                             errors[0]["error_chain_repr"])
                    replacements[group] += 1
                    schedule(group)
                    continue
                _report_failed(states, emit)  # the group is dropped
                cause = (terminal or errors)[0]
                why = "a non-retryable rollout error" if terminal else (
                    f"retryable errors after {replacements[group]} replacement groups")
                raise RuntimeError(f"rollout group {group} failed with {why}; stopping the batch: "
                                   f"{cause['error_chain_repr']}")
    finally:
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
    return replacements


async def _call_model(http: aiohttp.ClientSession, base_url: str, spec: TrajectorySpec) -> dict[str, Any]:
    """POST /generate once; an error answer raises the SDK's exception for its status."""
    payload = {"input_ids": spec.prompt_ids, "sampling_params": spec.sampling_params, "return_logprob": True}
    try:
        async with http.post(f"{base_url}/generate", json=payload, headers={TRAJECTORY_HEADER: spec.id}) as reply:
            body = await reply.read()
            if reply.status >= 400:
                raise status_error(reply.status, body)
    except aiohttp.ClientError as error:
        raise APIConnectionError(f"Connection error: {error!r}") from error
    return json.loads(body)  # type: ignore[no-any-return]


def _report_failed(states: list[RolloutState], emit: Emit) -> None:
    """Every trajectory of a dropped group, failed, with its own error (or the group's first)."""
    first = next(s.error for s in states if s.error is not None)
    for state in states:
        if state.error is not None and state.record is not None and state.record.outcome == "failed":
            emit(state.record)  # the rollout's own failed record (a real framework's, with its evidence)
            continue
        error = state.error or first
        emit(SampleRecord(trajectory=state.spec.id, group=state.spec.group, outcome="failed", status="ERROR",
                          prompt_length=len(state.spec.prompt_ids),
                          error=ErrorInfo(error["error"], error["error_chain_repr"], error["error_chain_str"])))
