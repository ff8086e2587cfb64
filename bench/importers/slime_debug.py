"""`slime-debug` (alias `miles-debug`): the files slime and miles write with `--save-debug-rollout-data`.

Each file is a `torch.save` of `{"rollout_id": N, "samples": [Sample.to_dict(), ...]}` (one file per
rollout step, `PATH.format(rollout_id=...)`; eval steps are prefixed `eval_`). A sample's `tokens` are
the prompt ids followed by `response_length` response ids; in multi-turn samples the response
interleaves the model's tokens (`loss_mask` 1) with tool-output tokens the client appended (mask 0).
Each run of mask-1 tokens is one turn's output, the mask-0 run after it the next turn's
`input_ids_append`. What a sample does not hold (latencies, sampling params, cached tokens, each
turn's own text in multi-turn samples) is written as unknown and named in the trajectory's metadata.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .common import (
    DraftTrajectory, DraftTurn, DumpError, ImportOptions, ImportSummary, check_ids, check_logprobs, finish, json_safe,
)
from .safe_pickle import UnsafePickleError, load_torch_save

KIND = "slime-debug"
ALIASES = ("miles-debug",)
FINISH_BY_STATUS = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "abort"}
UNKNOWN = ["latency (written as 0)", "sampling_params", "cached_tokens (written as 0)"]


def dump_files(path: Path) -> list[Path]:
    """A single file, or a folder's `*.pt` files in rollout order (`0.pt`, `1.pt`, ..., then `eval_*`)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    files = sorted(path.glob("*.pt"), key=_rollout_order)
    if not files:
        raise DumpError(f"{path}: the folder holds no *.pt debug rollout files")
    return files


def _rollout_order(path: Path) -> tuple[int, int, str]:
    match = re.fullmatch(r"(eval_)?(\d+)", path.stem)
    if match is None:
        return (2, 0, path.name)
    return (1 if match.group(1) else 0, int(match.group(2)), path.name)


def load_dump(path: Path) -> dict[str, Any]:
    """One debug rollout file, read with the safe unpickler; a DumpError names the file and the problem."""
    try:
        data = load_torch_save(path)
    except UnsafePickleError as error:
        raise DumpError(f"{path}: {error}") from error
    except Exception as error:  # a corrupt pickle raises whatever its broken opcodes lead to
        raise DumpError(f"{path}: cannot read it as a torch.save file: {error}") from error
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DumpError(f"{path}: expected a dict with a 'samples' list (slime/miles --save-debug-rollout-data), "
                        f"got {type(data).__name__}" + (f" with keys {sorted(map(str, data))[:8]}"
                                                        if isinstance(data, dict) else ""))
    return data


def import_slime_debug(path: Path, out: Path, options: ImportOptions) -> ImportSummary:
    files = dump_files(path)
    drafts: list[DraftTrajectory] = []
    counts: dict[str, int] = {}
    for file in files:
        data = load_dump(file)
        rollout_id = data.get("rollout_id", file.stem)
        prefix = f"{'eval' if file.stem.startswith('eval_') else 'r'}{rollout_id}"  # eval_N.pt: eval of step N
        samples = data["samples"]
        counts[file.name] = len(samples)
        for position, sample in enumerate(samples):
            drafts.append(_draft(sample, f"{file}: samples[{position}]", rollout_id, prefix, position, options))
    details = {
        "input": path.name, "files": counts, "samples": len(drafts),
        "format": "slime/miles --save-debug-rollout-data (torch.save of rollout_id and Sample.to_dict() samples)",
        "unknown": UNKNOWN + ["each turn's text in multi-turn samples (decoded from ids when the tokenizer is "
                              "rollout-bench's, else empty)"],
    }
    context = None
    if options.sampling_params is None:
        context = _default_budget(drafts, details)
    return finish(drafts, out, kind=KIND, source=path, options=options, details=details, context_length=context)


def _default_budget(drafts: list[DraftTrajectory], details: dict[str, Any]) -> int:
    """With no --sampling-params: every request asks for the longest answer seen, in a context that holds it.

    A dump holds no sampling params; a client replaying the trace takes its `max_new_tokens` from them (the
    slime-family targets do), and with none asks for the whole context, which the server refuses.
    """
    longest = max((len(t.output_ids) for d in drafts for t in d.turns), default=0) or 1
    for draft in drafts:
        for turn in draft.turns:
            turn.sampling_params = {"max_new_tokens": longest}
    details["sampling_params"] = (f"max_new_tokens {longest}: the longest answer seen (no --sampling-params given; "
                                  "the dump holds none)")
    return max(max(len(d.prompt_ids) + sum(len(t.append) for t in d.turns) + longest, len(d.all_ids()))
               for d in drafts)


def _draft(sample: Any, where: str, rollout_id: Any, prefix: str, position: int,
           options: ImportOptions) -> DraftTrajectory:
    if not isinstance(sample, dict):
        raise DumpError(f"{where}: expected a Sample.to_dict() dict, got {type(sample).__name__}")
    for key in ("tokens", "response_length", "status"):
        if key not in sample:
            raise DumpError(f"{where}: the sample has no {key!r}")
    tokens = check_ids(sample["tokens"], where, "tokens")
    length = sample["response_length"]
    if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= len(tokens):
        raise DumpError(f"{where}: response_length {length!r} must be an integer in 0..len(tokens) ({len(tokens)})")
    status = sample["status"]
    if status not in FINISH_BY_STATUS:
        raise DumpError(f"{where}: status {status!r} is not one of {', '.join(FINISH_BY_STATUS)} "
                        "(a pending sample was never generated)")
    prompt_ids, response = tokens[: len(tokens) - length], tokens[len(tokens) - length:]
    mask = sample.get("loss_mask")
    mask = [1] * length if mask is None else check_ids(mask, where, "loss_mask")
    if len(mask) != length or any(m not in (0, 1) for m in mask):
        raise DumpError(f"{where}: loss_mask must hold response_length ({length}) zeros and ones, got {len(mask)} "
                        "values" + ("" if len(mask) != length else " with other values"))
    logprobs = sample.get("rollout_log_probs")
    if logprobs is not None:
        if not isinstance(logprobs, (list, tuple)) or len(logprobs) != length:
            got = len(logprobs) if isinstance(logprobs, (list, tuple)) else type(logprobs).__name__
            raise DumpError(f"{where}: rollout_log_probs must hold response_length ({length}) numbers, got {got}")
    versions = [str(v) for v in sample.get("weight_versions") or []]
    sampling = dict(options.sampling_params or {})
    group_index, index = sample.get("group_index"), sample.get("index")
    notes: list[str] = []

    runs = _runs(mask)
    turns: list[DraftTurn] = []
    pending_append: list[int] = []
    for value, start, end in runs:
        if value == 0:
            pending_append = response[start:end]
            continue
        out_lp = None
        if logprobs is not None:
            out_lp = check_logprobs(list(logprobs[start:end]), where, f"rollout_log_probs[{start}:{end}]", end - start)
        turns.append(DraftTurn(append=pending_append, output_ids=response[start:end], logprobs=out_lp,
                               finish_reason={"type": "stop"}, weight_version=None, sampling_params=sampling))
        pending_append = []
    if not turns:  # aborted before any answer: one turn with no output
        turns.append(DraftTurn(append=pending_append, output_ids=[], logprobs=[] if logprobs is not None else None,
                               finish_reason={"type": "stop"}, weight_version=None, sampling_params=sampling))
    elif pending_append:  # no request carried them: the trace cannot hold them
        notes.append(f"the sample ends with {len(pending_append)} tokens the client appended after its last answer "
                     "(no request sent them); they are not in the trace")
    last = turns[-1]
    kind = FINISH_BY_STATUS[status]
    if kind == "length":
        last.finish_reason = {"type": "length", "length": len(last.output_ids)}
    elif kind == "abort":
        last.finish_reason = {"type": "abort", "message": f"the sample's status is {status!r} in the dump"}
    for k, turn in enumerate(turns):
        turn.weight_version = versions[min(k, len(versions) - 1)] if versions else None
    if versions and len(versions) != len(turns):
        notes.append(f"{len(versions)} weight_versions for {len(turns)} turns: turn k took weight_versions[k] "
                     "(the last one past the end)")
    if len(turns) == 1 and isinstance(sample.get("response"), str):
        turns[0].text = sample["response"]
    prompt = sample.get("prompt")
    prompt_text = prompt if isinstance(prompt, str) else None
    messages = prompt if isinstance(prompt, list) and json_safe(prompt) else None
    reward = sample.get("reward")
    metadata: dict[str, Any] = {
        "imported": {"record": where.rsplit("/", 1)[-1], "rollout_id": rollout_id if json_safe(rollout_id) else str(rollout_id),
                     "group_index": group_index, "index": index, "status": status},
        "unknown": UNKNOWN + ([] if logprobs is not None else ["logprobs (the sample has no rollout_log_probs)"]),
    }
    if isinstance(reward, dict):
        metadata["reward"] = reward if json_safe(reward) else str(reward)
        reward = None
    elif reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise DumpError(f"{where}: reward {reward!r:.40} is neither a number, a dict nor None")
    if notes:
        metadata["notes"] = notes
    if json_safe(sample.get("label")):
        metadata["label"] = sample.get("label")
    group = f"{prefix}-g{group_index if group_index is not None else f'x{position}'}"
    ident = f"{prefix}-s{index if index is not None else f'x{position}'}"
    return DraftTrajectory(id=ident, group_id=group, where=where, prompt_ids=prompt_ids, prompt_text=prompt_text,
                           prompt_messages=messages, turns=turns,
                           reward=None if reward is None else float(reward), metadata=metadata)


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal mask values."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs
