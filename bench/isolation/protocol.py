"""What the harness and a target's worker process say to each other.

The harness writes the `RolloutJob` as one JSON file; the worker answers on its stdout with
one JSON object per line (the target's own prints are moved to stderr, so they cannot
interleave with messages):

- `{"kind": "hello", "target", "fail_fast", "pid", "python", "versions", "prepares"}` once the adapter loaded;
- `{"kind": "ready", "at"}` once a target that `prepares` has prepared for its job (its Ray runtime, its
  actors): until then the harness counts the wait as start-up, not as a stall;
- `{"kind": "record", "record": {...}}` per sample record, as soon as the target emits it;
- `{"kind": "error", "error": {type, message, traceback}, "at"}` if the rollout raised (the batch crashed);
- `{"kind": "done", "cpu_s", "leaked_tasks", "at"}` when `run` returned or raised (`at`: unix time, the
  worker's clock, stamped before the worker exits and its open connections drop);
- `{"kind": "fatal", "error": {...}}` if the target could not even start (bad name, missing package).

Plain JSON (not pickle) so the two sides may run different interpreters and library versions.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec

from bench.records.sample import ErrorInfo, SampleRecord
from bench.targets.base import RolloutJob, TrajectorySpec
from faults.plan import make_rule, rule_table

MESSAGE_KINDS = ("hello", "ready", "record", "error", "done", "fatal")
TASK_MARKER = "--- asyncio task "  # heads each task's stack in the worker's hang dump
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(TrajectorySpec))
_decode_json = msgspec.json.Decoder().decode
_encode_json = msgspec.json.Encoder().encode


class ProtocolError(ValueError):
    """A line from the worker that is not a message of this protocol (names the line)."""


def job_to_json(job: RolloutJob) -> str:
    rest = json.dumps({
        "base_url": job.base_url,
        "context_length": job.context_length,
        "tokenizer_path": str(job.tokenizer_path),
        "concurrency": job.concurrency,
        "seed": job.seed,
        "client_faults": [rule_table(rule) for rule in job.client_faults],
        "options": job.options,
        "steps": job.steps, "on_step_failure": job.on_step_failure,
    })
    # field by field, not `asdict`: its deep copy of every prompt's ids cost the bench ~2 ms per trajectory
    specs = [{name: getattr(spec, name) for name in _SPEC_FIELDS} for spec in job.trajectories]
    try:  # every prompt's ids: msgspec encodes them in a sixth of json's time (41 -> 7 ms for agentic-500)
        trajectories = _encode_json(specs).decode()
    except (TypeError, ValueError, OverflowError):  # what msgspec cannot encode, json says as it always did
        trajectories = json.dumps(specs)
    # The specs come from a trace (JSON, so no NaN that msgspec would write as null); the rest (a plan's rule
    # tables, options) keeps json's spelling. Read back with `json.loads`, whatever the key order.
    return f'{rest[:-1]}, "trajectories": {trajectories}}}'


def job_from_json(text: str) -> RolloutJob:
    data = json.loads(text)
    return RolloutJob(
        base_url=data["base_url"],
        trajectories=[TrajectorySpec(**spec) for spec in data["trajectories"]],
        context_length=data["context_length"],
        tokenizer_path=Path(data["tokenizer_path"]),
        concurrency=data["concurrency"],
        seed=data["seed"],
        client_faults=[make_rule(table, table["name"]) for table in data["client_faults"]],
        options=data["options"],
        steps=data.get("steps", 1), on_step_failure=data.get("on_step_failure", "stop"),
    )


def error_to_dict(error: ErrorInfo) -> dict[str, str]:
    return dataclasses.asdict(error)


def error_from_dict(data: dict[str, str]) -> ErrorInfo:
    return ErrorInfo(data["type"], data["message"], data.get("traceback", ""), data.get("trajectory"))


def record_to_dict(record: SampleRecord) -> dict[str, Any]:
    return dataclasses.asdict(record)


def record_from_dict(data: dict[str, Any]) -> SampleRecord:
    data = dict(data)
    error = data.pop("error", None)
    return SampleRecord(**data, error=None if error is None else error_from_dict(error))


def encode(kind: str, **fields: Any) -> bytes:
    return (json.dumps({"kind": kind, **fields}, allow_nan=True) + "\n").encode()


def decode(line: bytes, where: str) -> dict[str, Any]:
    """One message; `where` names the line in errors (`worker stdout line 12`).

    msgspec first: a record line holds a whole trajectory's ids and logprobs, and `json.loads` of them was the
    bench's largest cost after serving (70 µs per request in an agentic run). What msgspec refuses (the NaN and
    Infinity that `encode` lets through, lone surrogates) goes through `json.loads`, which decides as it always did."""
    try:
        message = _decode_json(line)
    except (msgspec.DecodeError, UnicodeDecodeError):
        try:
            message = json.loads(line)
        except ValueError as error:
            raise ProtocolError(f"{where}: not JSON ({error}): {line[:200]!r}") from None
    if not isinstance(message, dict) or message.get("kind") not in MESSAGE_KINDS:
        raise ProtocolError(f"{where}: not a worker message: {line[:200]!r}")
    return message
