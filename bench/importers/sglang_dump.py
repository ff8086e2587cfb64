"""`sglang-dump`: the folder SGLang writes with `--dump-requests-folder` (every `--dump-requests-threshold`
finished requests, one `<date>_<time>.pkl`; also its `--crash-dump-folder` files).

A file is a pickle of `{"server_args": ServerArgs | None, "requests": [...]}` (older SGLang: the bare
list); each request is `(GenerateReqInput, out_dict, created_time, finished_time)`, `out_dict` being
the `/generate` answer (`text`, `output_ids`, `meta_info` with `finish_reason`, `prompt_tokens`,
`cached_tokens`, `output_token_logprobs` as `(logprob, id, text)`, `weight_version`, ...). SGLang's
classes are read as inert records (`safe_pickle.Opaque`): their fields, never their code.

SGLang sees requests, not trajectories. They are put back together in the order they were created: a
request whose input ids start with an earlier trajectory's whole context (its input and its output)
is that trajectory's next turn, the rest of its ids the turn's `input_ids_append`; any other request
starts a trajectory, and trajectories whose first input ids are the same form a group.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .common import (
    DraftTrajectory, DraftTurn, DumpError, ImportOptions, ImportSummary, check_ids, check_logprobs, finish, json_safe,
)
from .safe_pickle import Opaque, UnsafePickleError, load_pickle, looks_like

KIND = "sglang-dump"
FINISH_TYPES = ("stop", "length", "abort")


def dump_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    files = sorted(path.glob("*.pkl"))
    if not files:
        raise DumpError(f"{path}: the folder holds no *.pkl request dumps")
    return files


def _fields(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Opaque):
        return value.fields()
    return value if isinstance(value, dict) else None


def load_requests(path: Path) -> tuple[list[Any], dict[str, Any] | None]:
    """One dump file's request tuples and its server args (None when it holds none)."""
    try:
        data = load_pickle(path)
    except UnsafePickleError as error:
        raise DumpError(f"{path}: {error}") from error
    except Exception as error:  # a corrupt pickle raises whatever its broken opcodes lead to
        raise DumpError(f"{path}: cannot read it as a pickle ({looks_like(path)}): {type(error).__name__}: "
                        f"{error}") from error
    server_args = None
    if isinstance(data, dict) and "requests" in data:
        server_args = _fields(data.get("server_args"))
        data = data["requests"]
    if not isinstance(data, list):
        raise DumpError(f"{path}: expected SGLang's request dump (a list of requests, or a dict with 'requests'), "
                        f"got {type(data).__name__}")
    return data, server_args


class _Record:
    """One dumped request, checked."""

    def __init__(self, item: Any, where: str) -> None:
        self.where = where
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise DumpError(f"{where}: expected (request, output, created_time, finished_time), got "
                            f"{type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""))
        request, output, created, finished = item
        obj = _fields(request)
        if obj is None:
            raise DumpError(f"{where}: the request is a {type(request).__name__}, not a GenerateReqInput")
        if not isinstance(output, dict):
            raise DumpError(f"{where}: the output is a {type(output).__name__}, not SGLang's answer dict")
        ids = obj.get("input_ids")
        if ids is None:
            ids = output.get("prompt_token_ids")
        if ids is None:
            raise DumpError(f"{where}: the request has no input_ids (a text request, dumped without its token ids); "
                            "only token-id requests can be replayed by ids")
        if ids and isinstance(ids[0], list):
            raise DumpError(f"{where}: a batched request (a list of input_ids lists); expected one request per record")
        self.input_ids = check_ids(ids, where, "request.input_ids")
        self.output_ids = check_ids(output.get("output_ids"), where, "output.output_ids")
        meta = output.get("meta_info")
        if not isinstance(meta, dict):
            raise DumpError(f"{where}: the output has no meta_info dict")
        completion = meta.get("completion_tokens")
        if isinstance(completion, int) and completion != len(self.output_ids):
            raise DumpError(f"{where}: meta_info.completion_tokens is {completion} but output_ids has "
                            f"{len(self.output_ids)} ids (a stream dumped with incremental output holds only its "
                            "last chunk)")
        reason = meta.get("finish_reason")
        if reason is not None and (not isinstance(reason, dict) or reason.get("type") not in FINISH_TYPES):
            raise DumpError(f"{where}: meta_info.finish_reason {reason!r:.80} is not SGLang's object "
                            f"(type {', '.join(FINISH_TYPES)})")
        if reason is None:
            raise DumpError(f"{where}: meta_info.finish_reason is missing (an unfinished request)")
        self.finish_reason = dict(reason) if json_safe(reason) else {"type": reason["type"]}
        pairs = meta.get("output_token_logprobs")
        self.logprobs: list[float] | None = None
        if pairs:
            if not isinstance(pairs, list) or any(not isinstance(p, (list, tuple)) or len(p) < 2 for p in pairs):
                raise DumpError(f"{where}: meta_info.output_token_logprobs must be (logprob, id, text) entries")
            if [p[1] for p in pairs] != self.output_ids:
                raise DumpError(f"{where}: meta_info.output_token_logprobs name other ids than output_ids")
            self.logprobs = check_logprobs([p[0] for p in pairs], where, "meta_info.output_token_logprobs",
                                           len(self.output_ids))
        elif self.output_ids and pairs is not None:
            raise DumpError(f"{where}: meta_info.output_token_logprobs is empty for {len(self.output_ids)} output ids")
        text = output.get("text")
        self.text = text if isinstance(text, str) else None
        version = meta.get("weight_version")
        self.weight_version = None if version is None else str(version)
        cached = meta.get("cached_tokens", 0)
        self.cached_tokens = cached if isinstance(cached, int) and cached >= 0 else 0
        sampling = obj.get("sampling_params")
        self.sampling_params = dict(sampling) if isinstance(sampling, dict) and json_safe(sampling) else {}
        for name, value in (("created_time", created), ("finished_time", finished)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DumpError(f"{where}: {name} must be a number of seconds, got {value!r:.40}")
        if finished < created:
            raise DumpError(f"{where}: finished_time {finished} is before created_time {created}")
        self.created, self.total = float(created), float(finished) - float(created)
        rid = obj.get("rid")
        self.rid = rid if isinstance(rid, str) else None


def import_sglang_dump(path: Path, out: Path, options: ImportOptions) -> ImportSummary:
    records: list[_Record] = []
    counts: dict[str, int] = {}
    server_args: dict[str, Any] | None = None
    for file in dump_files(path):
        items, args = load_requests(file)
        server_args = server_args or args
        counts[file.name] = len(items)
        records += [_Record(item, f"{file}: requests[{i}]") for i, item in enumerate(items)]
    records.sort(key=lambda r: r.created)  # stable: equal times keep the dump's order
    drafts = _trajectories(records)
    details = {
        "input": path.name, "files": counts, "requests": len(records), "trajectories": len(drafts),
        "format": "SGLang --dump-requests-folder (pickled (GenerateReqInput, output, created, finished) tuples)",
        "unknown": ["latency.ttft (written as 0; latency.total is finished - created)", "reward",
                    "trajectories: rebuilt from the requests' token prefixes"],
    }
    model = str(server_args["model_path"]) if server_args and server_args.get("model_path") else None
    context = server_args.get("context_length") if server_args else None
    return finish(drafts, out, kind=KIND, source=path, options=options, details=details, model=model,
                  context_length=context if isinstance(context, int) and context > 0 else None)


def _trajectories(records: list[_Record]) -> list[DraftTrajectory]:
    """Chain requests into trajectories by token prefix; group identical first prompts."""
    drafts: list[DraftTrajectory] = []
    contexts: dict[int, list[int]] = {}  # draft number -> its whole context (inputs + outputs) so far
    open_by_length: dict[int, dict[bytes, list[int]]] = defaultdict(lambda: defaultdict(list))
    groups: dict[tuple[int, ...], str] = {}
    members: dict[str, int] = defaultdict(int)
    for record in records:
        owner = _continued(record.input_ids, open_by_length)
        if owner is None:
            group = groups.setdefault(tuple(record.input_ids), f"g{len(groups):05d}")
            owner = len(drafts)
            drafts.append(DraftTrajectory(id=f"{group}-{members[group]}", group_id=group, where=record.where,
                                          prompt_ids=record.input_ids, prompt_text=None, turns=[],
                                          metadata={"imported": {"records": []}}))
            members[group] += 1
            append: list[int] = []
        else:
            previous = contexts[owner]
            _close(open_by_length, previous, owner)
            append = record.input_ids[len(previous):]
        draft = drafts[owner]
        draft.turns.append(DraftTurn(append=append, output_ids=record.output_ids, logprobs=record.logprobs,
                                     finish_reason=record.finish_reason, weight_version=record.weight_version,
                                     sampling_params=record.sampling_params, text=record.text,
                                     cached_tokens=min(record.cached_tokens, len(record.input_ids)),
                                     latency=(0.0, record.total)))
        draft.metadata["imported"]["records"].append(record.where + (f" (rid {record.rid})" if record.rid else ""))
        context = record.input_ids + record.output_ids
        contexts[owner] = context
        open_by_length[len(context)][_key(context)].append(owner)
    for draft in drafts:
        draft.metadata["unknown"] = ["latency.ttft (0)", "reward"]
    return drafts


def _key(ids: list[int]) -> bytes:
    return b"".join(i.to_bytes(4, "little") for i in ids)


def _continued(ids: list[int], open_by_length: dict[int, dict[bytes, list[int]]]) -> int | None:
    """The trajectory whose whole context is the longest proper prefix of `ids` (first come, first served)."""
    packed = _key(ids)
    for length in sorted((n for n in open_by_length if n < len(ids)), reverse=True):
        owners = open_by_length[length].get(packed[: 4 * length])
        if owners:
            return owners[0]
    return None


def _close(open_by_length: dict[int, dict[bytes, list[int]]], context: list[int], owner: int) -> None:
    bucket = open_by_length[len(context)]
    key = _key(context)
    bucket[key].remove(owner)
    if not bucket[key]:
        del bucket[key]
