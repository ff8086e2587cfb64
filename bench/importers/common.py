"""What every importer shares: draft trajectories, the tokenizer decision, the header, the write.

An importer turns a dump into `DraftTrajectory`s (ids, logprobs, finish reasons, whatever texts the
dump holds); `finish` then decides the tokenizer once for the whole dump (the bench's own when every
id fits it and every text the dump holds is what its ids say, else the options' or a placeholder
derived from the data), fills texts, and writes the trace through `TraceWriter` (checked records,
all or nothing).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import __version__
from bench.tokenizer import TOKENIZER_NAME, load_tokenizer
from bench.trace.schema import (
    SCHEMA_VERSION, Latency, Prompt, Request, Response, TokenizerInfo, TraceHeader, TraceSource, Trajectory, Turn,
)
from bench.trace.writer import TraceWriter

UNKNOWN_MODEL = "unknown"
UNKNOWN_TOKENIZER = "unknown"


class DumpError(Exception):
    """The dump cannot be imported; the message names the file, the record and what is wrong."""


@dataclass
class ImportOptions:
    """The header facts a dump does not hold, as the user gave them (None: derive from the data)."""

    model: str | None = None
    tokenizer_name: str | None = None
    vocab_size: int | None = None
    eos_token_id: int | None = None
    context_length: int | None = None
    sampling_params: dict[str, Any] | None = None


@dataclass
class DraftTurn:
    append: list[int]  # ids this turn adds after the previous turn's output (turn 0: after the prompt)
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: dict[str, Any] | None
    weight_version: str | None
    sampling_params: dict[str, Any]
    text: str | None = None  # the dump's own text of this output, when it has one
    cached_tokens: int = 0
    latency: tuple[float, float] = (0.0, 0.0)  # ttft, total


@dataclass
class DraftTrajectory:
    id: str
    group_id: str
    where: str  # "FILE: samples[3]": names the record in error messages
    prompt_ids: list[int]
    prompt_text: str | None
    turns: list[DraftTurn]
    prompt_messages: list[dict[str, Any]] | None = None
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def all_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.append + turn.output_ids
        return ids


@dataclass
class ImportSummary:
    path: Path
    trajectories: int
    groups: int
    turns: int
    tokenizer: str
    details: dict[str, Any]


def check_ids(value: Any, where: str, what: str) -> list[int]:
    """A list of non-negative ints (bools and floats refused), or a DumpError naming the record."""
    if not isinstance(value, (list, tuple)):
        raise DumpError(f"{where}: {what} must be a list of token ids, got {type(value).__name__}")
    for position, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise DumpError(f"{where}: {what}[{position}] must be a non-negative integer token id, got {item!r:.40}")
    return list(value)


def check_logprobs(values: Any, where: str, what: str, count: int) -> list[float]:
    if not isinstance(values, (list, tuple)) or len(values) != count:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise DumpError(f"{where}: {what} must be a list of {count} numbers (one per output id), got {got}")
    out = []
    for position, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 0:
            raise DumpError(f"{where}: {what}[{position}] must be a finite log-probability <= 0, got {value!r:.40}")
        out.append(float(value))
    return out


def _bench_tokenizer_fits(drafts: list[DraftTrajectory]) -> tuple[bool, str]:
    """Whether the dump is in the bench's own tokenizer: every id fits it, every text the dump holds matches."""
    tokenizer = load_tokenizer()
    checked = 0
    for draft in drafts:
        if any(i >= tokenizer.vocab_size for i in draft.all_ids()):
            return False, f"{draft.where}: an id is outside {TOKENIZER_NAME}"
        if draft.prompt_text is not None:
            if tokenizer.encode(draft.prompt_text) != draft.prompt_ids:
                return False, f"{draft.where}: the prompt text is not the {TOKENIZER_NAME} tokenization of its ids"
            checked += 1
        for turn in draft.turns:
            if turn.text is not None:  # with the stop token trimmed (SGLang) or kept (a client's own decode)
                if turn.text not in (tokenizer.decode(_trim_stop(turn, tokenizer.eos_token_id)),
                                     tokenizer.decode(turn.output_ids)):
                    return False, f"{draft.where}: an output text is not what its ids decode to in {TOKENIZER_NAME}"
                checked += 1
    if not checked:
        return False, "the dump holds no text to check the ids against"
    return True, f"every id fits {TOKENIZER_NAME} and all {checked} texts the dump holds match their ids"


def _trim_stop(turn: DraftTurn, eos_token_id: int) -> list[int]:
    matched = _matched(turn, eos_token_id)
    ids = turn.output_ids
    return ids[:-1] if ids and isinstance(matched, int) and ids[-1] == matched else ids


def _tokenizer_info(drafts: list[DraftTrajectory], options: ImportOptions,
                    details: dict[str, Any]) -> tuple[TokenizerInfo, bool]:
    """The header's tokenizer, and whether it is the bench's own (then texts can be decoded from ids)."""
    notes: list[str] = []
    bench = False
    if options.tokenizer_name is None or options.tokenizer_name == TOKENIZER_NAME:
        bench, why = _bench_tokenizer_fits(drafts)
        notes.append(f"{TOKENIZER_NAME}: {why}" if bench else f"not {TOKENIZER_NAME} ({why})")
        if options.tokenizer_name == TOKENIZER_NAME and not bench:
            raise DumpError(f"--tokenizer-name {TOKENIZER_NAME}: the dump does not fit it: {why}")
    if bench:
        tokenizer = load_tokenizer()
        info = TokenizerInfo(name=TOKENIZER_NAME, vocab_size=options.vocab_size or tokenizer.vocab_size,
                             eos_token_id=tokenizer.eos_token_id if options.eos_token_id is None
                             else options.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    else:
        max_id = max((max(d.all_ids(), default=0) for d in drafts), default=0)
        vocab = options.vocab_size
        if vocab is None:
            vocab = max_id + 1
            notes.append(f"vocab_size {vocab}: the largest id seen + 1 (no --vocab-size given)")
        elif vocab <= max_id:
            raise DumpError(f"--vocab-size {vocab}: the dump holds token id {max_id}")
        eos = options.eos_token_id
        if eos is None:
            eos = _likely_eos(drafts)
            notes.append(f"eos_token_id {eos}: the most common last id of answers that stopped (no --eos-token-id)")
        info = TokenizerInfo(name=options.tokenizer_name or UNKNOWN_TOKENIZER, vocab_size=max(vocab, eos + 1),
                             eos_token_id=eos)
    details["tokenizer"] = notes
    return info, bench


def _likely_eos(drafts: list[DraftTrajectory]) -> int:
    last = Counter(t.output_ids[-1] for d in drafts for t in d.turns
                   if t.output_ids and (t.finish_reason or {}).get("type") == "stop")
    return last.most_common(1)[0][0] if last else 0


def _matched(turn: DraftTurn, eos_token_id: int) -> Any:
    """What a stop matched: the dump's word, else the eos token when the output ends with it (else None)."""
    reason = turn.finish_reason or {}
    if reason.get("type") != "stop":
        return None
    if "matched" in reason:
        return reason["matched"]
    return eos_token_id if turn.output_ids and turn.output_ids[-1] == eos_token_id else None


def _with_matched(turn: DraftTurn, eos_token_id: int) -> dict[str, Any] | None:
    """A stop reason the dump gave without `matched` (slime's status says only "completed") gets one."""
    reason = turn.finish_reason
    if reason is None or reason.get("type") != "stop" or "matched" in reason:
        return reason
    return {**reason, "matched": _matched(turn, eos_token_id)}


def finish(drafts: list[DraftTrajectory], out: str | Path, *, kind: str, source: Path, options: ImportOptions,
           details: dict[str, Any], model: str | None = None, context_length: int | None = None,
           metadata: dict[str, Any] | None = None) -> ImportSummary:
    """Decide the tokenizer, fill texts, check and write the trace (nothing is left behind on an error)."""
    if not drafts:
        raise DumpError(f"{source}: the dump holds no records to import")
    ids = [d.id for d in drafts]
    duplicate = next((i for i, c in Counter(ids).items() if c > 1), None)
    if duplicate is not None:
        raise DumpError(f"{source}: two records give the trajectory id {duplicate!r}")
    tokenizer_info, bench = _tokenizer_info(drafts, options, details)
    longest = max(len(d.all_ids()) for d in drafts)
    context = options.context_length or context_length
    if context is None:
        context = max(longest, 1)
        details["context_length"] = f"{context}: the longest trajectory (no --context-length given)"
    header = TraceHeader(
        schema_version=SCHEMA_VERSION,
        source=TraceSource(kind="recorded", generator=f"rollout-bench import {kind} {__version__}", details=details),
        model=options.model or model or UNKNOWN_MODEL, tokenizer=tokenizer_info, context_length=context,
        created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), metadata=metadata or {})
    tokenizer = load_tokenizer() if bench else None
    turns = 0
    try:
        with TraceWriter(out, header) as writer:
            for draft in drafts:
                writer.write(_trajectory(draft, tokenizer, tokenizer_info.eos_token_id))
                turns += len(draft.turns)
    except DumpError:
        raise
    except Exception as error:  # a record the trace checks refuse: name it as the dump's record
        where = draft.where if "draft" in locals() else str(source)
        raise DumpError(f"{where}: {error}") from error
    return ImportSummary(Path(out), len(drafts), len({d.group_id for d in drafts}), turns, tokenizer_info.name,
                         details)


def _trajectory(draft: DraftTrajectory, tokenizer: Any, eos_token_id: int) -> Trajectory:
    prompt_text = draft.prompt_text
    if prompt_text is None:
        prompt_text = tokenizer.decode(draft.prompt_ids) if tokenizer is not None else ""
    context = len(draft.prompt_ids)
    turns = []
    for turn in draft.turns:
        context += len(turn.append)
        text = turn.text
        if tokenizer is not None:
            text = tokenizer.decode(_trim_stop(turn, eos_token_id))
        response = Response(
            output_ids=turn.output_ids, logprobs=turn.logprobs, text=text or "",
            finish_reason=_with_matched(turn, eos_token_id),
            weight_version=turn.weight_version, prompt_tokens=context, completion_tokens=len(turn.output_ids),
            cached_tokens=turn.cached_tokens, latency=Latency(ttft=turn.latency[0], total=turn.latency[1]))
        turns.append(Turn(request=Request(endpoint="/generate", sampling_params=turn.sampling_params,
                                          input_ids_append=turn.append), response=response))
        context += len(turn.output_ids)
    return Trajectory(id=draft.id, group_id=draft.group_id,
                      prompt=Prompt(ids=draft.prompt_ids, text=prompt_text, messages=draft.prompt_messages),
                      turns=turns, reward=draft.reward, metadata=draft.metadata)


def json_safe(value: Any) -> bool:
    """Whether `value` is plain JSON data (dump metadata is copied into the trace only then)."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(json_safe(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_safe(v) for k, v in value.items())
    return False
