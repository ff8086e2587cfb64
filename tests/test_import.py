"""`rollout-bench import`: slime/miles debug rollout data and SGLang request dumps turned into traces.

Hand-made dumps are written in the real formats: a torch.save archive is a zip holding `<dir>/data.pkl`
(plain data needs nothing else; one test writes a real `torch.save` with tensors in the miles
environment), SGLang's dump pickles `GenerateReqInput`/`ServerArgs` dataclasses, made here under
SGLang's module names so the pickles name the same globals. The end-to-end test imports a dump miles
wrote while running against the bench and replays it (see its docstring).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench import RunConfig, run
from bench.cli import main
from bench.importers import DumpError, ImportOptions, import_dump
from bench.targets.frameworks.envs import target_python
from bench.tokenizer import TOKENIZER_NAME, load_tokenizer
from bench.trace import open_trace, validate_trace

TOK = load_tokenizer()
EOS = TOK.eos_token_id
MILES = target_python("miles")
needs_miles = pytest.mark.skipif(MILES is None, reason="the miles environment is not built (make targets; "
                                                      "ROLLOUT_BENCH_TARGETS_DIR)")


def torch_save_like(obj: Any, path: Path) -> Path:
    """What `torch.save` writes for plain data: a zip with the pickle at `<dir>/data.pkl`."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("dump/data.pkl", pickle.dumps(obj, protocol=2))
        archive.writestr("dump/byteorder", "little")
        archive.writestr("dump/version", "3\n")
    return path


def sample(prompt: str, answers: list[str], *, tools: list[str] = (), status: str = "completed", group: int = 0,
           index: int = 0, logprobs: bool = True, reward: Any = 1.0, eos: bool = True) -> dict[str, Any]:
    """A `Sample.to_dict()`: model answers (loss mask 1) interleaved with tool outputs (loss mask 0)."""
    prompt_ids = TOK.encode(prompt)
    response: list[int] = []
    mask: list[int] = []
    for k, answer in enumerate(answers):
        ids = TOK.encode(answer) + ([EOS] if eos else [])
        response += ids
        mask += [1] * len(ids)
        if k < len(tools):
            tool = TOK.encode(tools[k])
            response += tool
            mask += [0] * len(tool)
    return {"group_index": group, "index": index, "prompt": prompt, "tokens": prompt_ids + response,
            "response": TOK.decode(response), "response_length": len(response), "label": "42", "reward": reward,
            "loss_mask": mask, "weight_versions": [str(k + 3) for k in range(len(answers))],
            "rollout_log_probs": [-0.5 if m else 0.0 for m in mask] if logprobs else None,
            "rollout_routed_experts": None, "remove_sample": False, "status": status, "metadata": {"x": 1},
            "spec_info": {"spec_accept_token_num": 0}, "prefix_cache_info": {"cached_tokens": 0}}


def trajectories(path: Path) -> tuple[Any, list[Any]]:
    assert list(validate_trace(path)) == []
    with open_trace(path) as reader:
        return reader.header, list(reader)


def test_single_turn_group(tmp_path: Path) -> None:
    dump = torch_save_like({"rollout_id": 7, "samples": [sample("What is 6*7?", ["It is 42."], index=0),
                                                         sample("What is 6*7?", ["42"], index=1, reward=0.0)]},
                           tmp_path / "7.pt")
    summary = import_dump("miles-debug", dump, tmp_path / "t.jsonl", ImportOptions())
    header, trajs = trajectories(summary.path)
    assert header.source.kind == "recorded" and header.source.generator.startswith("rollout-bench import slime-debug")
    assert header.tokenizer.name == TOKENIZER_NAME and header.tokenizer.eos_token_id == EOS
    assert header.source.details["files"] == {"7.pt": 2} and "latency (written as 0)" in header.source.details["unknown"]
    assert [t.id for t in trajs] == ["r7-s0", "r7-s1"] and {t.group_id for t in trajs} == {"r7-g0"}
    first = trajs[0]
    assert first.prompt.ids == TOK.encode("What is 6*7?") and first.prompt.text == "What is 6*7?"
    (turn,) = first.turns
    assert turn.response.output_ids == TOK.encode("It is 42.") + [EOS]
    assert turn.response.text == "It is 42." and turn.response.finish_reason == {"type": "stop", "matched": EOS}
    assert turn.response.logprobs == [-0.5] * len(turn.response.output_ids)
    assert turn.response.weight_version == "3" and turn.response.latency.total == 0.0
    assert turn.request.input_ids_append == [] and turn.request.sampling_params == {"max_new_tokens": len(turn.response.output_ids)}
    assert [t.reward for t in trajs] == [1.0, 0.0]


def test_multi_turn_from_the_loss_mask(tmp_path: Path) -> None:
    s = sample("Fix the bug.", ["I run the tests.", "Now I patch.", "Done."], tools=["3 failed", "all passed", "x"])
    summary = import_dump("slime-debug", torch_save_like({"rollout_id": 0, "samples": [s]}, tmp_path / "0.pt"),
                          tmp_path / "t.jsonl", ImportOptions(sampling_params={"temperature": 1.0}))
    _, (traj,) = trajectories(summary.path)
    assert [t.response.text for t in traj.turns] == ["I run the tests.", "Now I patch.", "Done."]
    assert [t.request.input_ids_append for t in traj.turns] == [[], TOK.encode("3 failed"), TOK.encode("all passed")]
    assert [t.response.weight_version for t in traj.turns] == ["3", "4", "5"]
    assert all(t.request.sampling_params == {"temperature": 1.0} for t in traj.turns)
    # the full input of turn 2 is the prompt and everything before it
    assert traj.request_input_ids(2) == s["tokens"][: len(s["tokens"]) - len(TOK.encode("x"))
                                                    - len(TOK.encode("Done.")) - 1]
    # the tool output after the last answer was never sent: said, not invented
    assert "not in the trace" in traj.metadata["notes"][0]


def test_aborted_truncated_and_missing_logprobs(tmp_path: Path) -> None:
    samples = [sample("a", ["cut here"], status="truncated", eos=False, index=0),
               sample("b", ["stopp"], status="aborted", eos=False, index=1, logprobs=False),
               {**sample("c", [], status="aborted", index=2), "reward": None}]
    summary = import_dump("slime-debug", torch_save_like({"rollout_id": 1, "samples": samples}, tmp_path / "1.pt"),
                          tmp_path / "t.jsonl")
    _, trajs = trajectories(summary.path)
    cut, aborted, empty = (t.turns[-1].response for t in trajs)
    assert cut.finish_reason == {"type": "length", "length": len(TOK.encode("cut here"))}
    assert aborted.finish_reason["type"] == "abort" and aborted.logprobs is None
    assert "logprobs (the sample has no rollout_log_probs)" in trajs[1].metadata["unknown"]
    assert empty.output_ids == [] and empty.finish_reason["type"] == "abort" and trajs[2].reward is None


def test_a_folder_of_train_and_eval_files(tmp_path: Path) -> None:
    for name in ("0", "1", "eval_0"):
        torch_save_like({"rollout_id": int(name[-1]), "samples": [sample(f"q{name}", ["a"])]}, tmp_path / f"{name}.pt")
    summary = import_dump("slime-debug", tmp_path, tmp_path / "t.jsonl")
    header, trajs = trajectories(summary.path)
    assert [t.id for t in trajs] == ["r0-s0", "r1-s0", "eval0-s0"]
    assert header.source.details["files"] == {"0.pt": 1, "1.pt": 1, "eval_0.pt": 1}


def test_foreign_tokenizer_is_derived_from_the_data(tmp_path: Path) -> None:
    s = {**sample("q", ["a"]), "tokens": [5, 6, 7, 90000, 2], "response_length": 2, "loss_mask": [1, 1],
         "rollout_log_probs": [-1.0, -0.1], "prompt": "not these ids"}
    summary = import_dump("slime-debug", torch_save_like({"rollout_id": 0, "samples": [s]}, tmp_path / "0.pt"),
                          tmp_path / "t.jsonl")
    header, (traj,) = trajectories(summary.path)
    assert header.tokenizer.name == "unknown" and header.tokenizer.vocab_size == 90001
    assert header.tokenizer.eos_token_id == 2  # the last id of the answer that stopped
    assert any("largest id seen" in note for note in header.source.details["tokenizer"])
    assert traj.turns[0].response.finish_reason == {"type": "stop", "matched": 2}


@pytest.mark.parametrize("bad, message", [
    ({"tokens": [1, "x"]}, "samples[1]: tokens[1] must be a non-negative integer"),
    ({"response_length": 99}, "samples[1]: response_length 99 must be an integer in 0..len(tokens)"),
    ({"loss_mask": [1]}, "samples[1]: loss_mask must hold response_length"),
    ({"rollout_log_probs": None, "status": "pending"}, "samples[1]: status 'pending' is not one of"),
    ({"rollout_log_probs": [float("nan")] * 4}, "rollout_log_probs must hold response_length"),
])
def test_a_bad_record_is_named(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    dump = torch_save_like({"rollout_id": 0, "samples": [sample("ok", ["fine"]), {**sample("bad", ["no"]), **bad}]},
                           tmp_path / "0.pt")
    with pytest.raises(DumpError) as caught:
        import_dump("slime-debug", dump, tmp_path / "t.jsonl")
    assert str(dump) in str(caught.value) and message in str(caught.value)
    assert not (tmp_path / "t.jsonl").exists() and os.listdir(tmp_path) == ["0.pt"]  # nothing half-written


def test_a_corrupt_file_exits_1_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = torch_save_like({"rollout_id": 0, "samples": [sample("ok", ["fine"])]}, tmp_path / "0.pt")
    broken = tmp_path / "1.pt"
    broken.write_bytes(good.read_bytes()[:200])
    assert main(["import", "slime-debug", str(tmp_path), "--out", str(tmp_path / "t.jsonl")]) == 1
    err = capsys.readouterr().err
    assert f"{broken}: cannot read it as a torch.save file" in err
    assert not (tmp_path / "t.jsonl").exists()
    nan = torch_save_like({"rollout_id": 0, "samples": [{**sample("n", ["ab"]), "rollout_log_probs": [-1.0, float("nan"), -1.0]}]},
                          tmp_path / "2.pt")
    assert main(["import", "slime-debug", str(nan), "--out", str(tmp_path / "t.jsonl")]) == 1
    assert "samples[0]: rollout_log_probs[0:3][1] must be a finite log-probability" in capsys.readouterr().err


def test_plan_none_means_no_faults() -> None:
    from bench.cli import build_plan

    assert build_plan("none", None, None) is None
    assert build_plan("seed-000", None, None) is not None


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["import", "vllm-dump", str(tmp_path), "--out", str(tmp_path / "t.jsonl")])
    assert caught.value.code == 2
    assert main(["import", "slime-debug", str(tmp_path / "absent"), "--out", str(tmp_path / "t.jsonl")]) == 2
    assert main(["import", "slime-debug", str(tmp_path), "--out", str(tmp_path / "t.jsonl"),
                 "--sampling-params", "[1]"]) == 2


class _RunsCode:
    """A pickle whose loading would run `os.system` (what a plain pickle.load of a user's file allows)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    dump = torch_save_like({"rollout_id": 0, "samples": [sample("x", ["y"]), _RunsCode(marker)]}, tmp_path / "0.pt")
    with pytest.raises(DumpError, match=r"0\.pt: refused to load global (posix|os)\.system"):
        import_dump("slime-debug", dump, tmp_path / "t.jsonl")
    folder = tmp_path / "sglang"
    folder.mkdir()
    (folder / "a.pkl").write_bytes(pickle.dumps([_RunsCode(marker)]))
    with pytest.raises(DumpError, match=r"a\.pkl: refused to load global (posix|os)\.system"):
        import_dump("sglang-dump", folder, tmp_path / "t.jsonl")
    assert not marker.exists()


@needs_miles
def test_a_real_torch_save_with_tensors(tmp_path: Path) -> None:
    """torch.save itself (miles' environment): tensors are rebuilt from the archive's storages, without torch; a
    numpy array (miles' `rollout_routed_experts`) is read as an inert record, never by numpy's code."""
    s = sample("What is 6*7?", ["It is 42."], tools=[])
    script = (f"import torch, json; s = json.loads({json.dumps(json.dumps(s))}); "
              "s['rollout_log_probs'] = torch.tensor(s['rollout_log_probs'], dtype=torch.float32); "
              "s['tokens'] = torch.tensor(s['tokens'])[:]; "
              "import numpy; s['rollout_routed_experts'] = numpy.zeros((3, 2), dtype=numpy.int32); "
              f"torch.save(dict(rollout_id=0, samples=[s]), {str(tmp_path / '0.pt')!r})")
    subprocess.run([MILES, "-c", script], check=True)
    summary = import_dump("miles-debug", tmp_path / "0.pt", tmp_path / "t.jsonl")
    _, (traj,) = trajectories(summary.path)
    assert traj.prompt.ids + traj.turns[0].response.output_ids == s["tokens"]
    assert traj.turns[0].response.logprobs == [-0.5] * len(traj.turns[0].response.output_ids)


@needs_miles
def test_an_expanded_tensor_asking_for_more_than_its_storage_is_refused(tmp_path: Path) -> None:
    """A few bytes on disk must not become billions of elements in memory: torch.save of an expanded view keeps
    one element with strides 0."""
    script = ("import torch; t = torch.zeros(1).expand(3000, 3000); "
              f"torch.save(dict(rollout_id=0, samples=[dict(tokens=t)]), {str(tmp_path / '0.pt')!r})")
    subprocess.run([MILES, "-c", script], check=True)
    assert (tmp_path / "0.pt").stat().st_size < 4096
    with pytest.raises(Exception, match="expanded view"):
        import_dump("miles-debug", tmp_path / "0.pt", tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


# --- SGLang --dump-requests-folder ---

def _sglang_classes() -> tuple[type, type, dict[str, types.ModuleType]]:
    """Dataclasses under SGLang's module and class names, so the pickles name the globals SGLang's do."""

    @dataclasses.dataclass
    class GenerateReqInput:
        text: Any = None
        input_ids: Any = None
        sampling_params: Any = None
        return_logprob: Any = None
        rid: Any = None

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str = "Qwen/Qwen3-0.6B"
        context_length: int | None = 4096

    modules = {name: types.ModuleType(name) for name in
               ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.managers.io_struct", "sglang.srt.server_args")}
    for cls, name in ((GenerateReqInput, "sglang.srt.managers.io_struct"), (ServerArgs, "sglang.srt.server_args")):
        cls.__module__ = name
        cls.__qualname__ = cls.__name__
        setattr(modules[name], cls.__name__, cls)
    return GenerateReqInput, ServerArgs, modules


def _answer(ids: list[int], answer: str, *, finish: dict[str, Any] | None = None) -> dict[str, Any]:
    out = TOK.encode(answer) + [EOS]
    return {"text": answer, "output_ids": out,
            "meta_info": {"id": "x", "finish_reason": finish or {"type": "stop", "matched": EOS},
                          "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": 3,
                          "weight_version": "default", "output_token_logprobs": [(-0.25, i, None) for i in out]}}


def _write_sglang(folder: Path, records: list[Any], *, wrapped: bool = True) -> None:
    """SGLang's dump file: pickled only while the stand-in modules are importable (the reader never imports)."""
    Req, Server, modules = _sglang_classes()
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        items = [(Req(input_ids=ids, sampling_params={"max_new_tokens": 64}, return_logprob=True, rid=f"r{k}"),
                  out, created, finished) for k, (ids, out, created, finished) in enumerate(records)]
        data = {"server_args": Server(), "requests": items} if wrapped else items
        folder.mkdir(exist_ok=True)
        (folder / "2026-01-01_00-00-00.pkl").write_bytes(pickle.dumps(data))
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def test_sglang_requests_become_grouped_multi_turn_trajectories(tmp_path: Path) -> None:
    prompt = TOK.encode("Fix the bug.")
    a0, b0 = _answer(prompt, "run tests"), _answer(prompt, "read code")
    tool = TOK.encode("3 failed")
    a1_input = prompt + a0["output_ids"] + tool
    a1 = _answer(a1_input, "patched")
    other = TOK.encode("Another task.")
    records = [(prompt, a0, 10.0, 11.5), (prompt, b0, 10.1, 11.0), (other, _answer(other, "ok"), 10.2, 10.3),
               (a1_input, a1, 12.0, 12.5)]
    _write_sglang(tmp_path / "dump", records)
    summary = import_dump("sglang-dump", tmp_path / "dump", tmp_path / "t.jsonl")
    header, trajs = trajectories(summary.path)
    assert header.model == "Qwen/Qwen3-0.6B" and header.context_length == 4096
    assert header.tokenizer.name == TOKENIZER_NAME
    assert [(t.id, t.group_id, len(t.turns)) for t in trajs] == [("g00000-0", "g00000", 2), ("g00000-1", "g00000", 1),
                                                                  ("g00001-0", "g00001", 1)]
    first = trajs[0]
    assert first.turns[1].request.input_ids_append == tool
    assert first.request_input_ids(1) == a1_input
    assert first.turns[0].response.latency.total == 1.5 and first.turns[0].response.latency.ttft == 0.0
    assert first.turns[0].response.logprobs == [-0.25] * len(a0["output_ids"])
    assert first.turns[1].response.text == "patched" and first.turns[1].response.cached_tokens == 3
    assert first.turns[0].request.sampling_params == {"max_new_tokens": 64}


def test_sglang_bare_list_and_bad_records(tmp_path: Path) -> None:
    prompt = TOK.encode("hi")
    _write_sglang(tmp_path / "old", [(prompt, _answer(prompt, "yo"), 1.0, 2.0)], wrapped=False)
    header, (traj,) = trajectories(import_dump("sglang-dump", tmp_path / "old", tmp_path / "t.jsonl").path)
    assert header.model == "unknown" and traj.turns[0].response.output_ids[-1] == EOS
    bad = _answer(prompt, "yo", finish={"type": "exploded"})
    _write_sglang(tmp_path / "bad", [(prompt, _answer(prompt, "yo"), 1.0, 2.0), (prompt, bad, 1.0, 2.0)])
    with pytest.raises(DumpError, match=r"2026-01-01_00-00-00\.pkl: requests\[1\]: meta_info\.finish_reason"):
        import_dump("sglang-dump", tmp_path / "bad", tmp_path / "t2.jsonl")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DumpError, match=r"x\.pkl: cannot read it as a pickle"):
        import_dump("sglang-dump", tmp_path / "junk", tmp_path / "t3.jsonl")
    assert not (tmp_path / "t2.jsonl").exists() and not (tmp_path / "t3.jsonl").exists()


# --- end to end: a real miles dump replays with zero drift ---

@needs_miles
def test_a_real_miles_dump_replays_with_zero_drift(tmp_path: Path) -> None:
    """miles' real rollout (`generate_rollout`, legacy path) runs against the bench's mock on 8 trajectories of
    rlvr-500 (2 groups of 4) with no faults and writes its debug rollout data: miles' own `Sample.to_dict()` and
    `torch.save` in miles' layout, written by `tests.import_helpers.DumpingMiles` (miles' own writer,
    `RolloutManager._save_debug_rollout_data`, cannot be imported on CPU; see that module). The dump is
    imported with the CLI and replayed by miles with no faults: every request is identified with no drift,
    no invariant fails, and the replayed samples' tokens and logprobs are the dump's."""
    dump = tmp_path / "rollout_data"
    first = asyncio.run(run(RunConfig(
        trace="rlvr-500", plan=None, target="tests.import_helpers:DumpingMiles", n=8, python=MILES, watchdog_s=120.0,
        target_options={"args": {"save_debug_rollout_data": f"{dump}/{{rollout_id}}.pt"}})))
    assert first.violations == [] and {r.outcome for r in first.records} == {"completed"}
    assert [p.name for p in dump.iterdir()] == ["0.pt"]
    trace = tmp_path / "imported.jsonl.gz"
    assert main(["import", "miles-debug", str(dump), "--out", str(trace)]) == 0
    header, trajs = trajectories(trace)
    assert header.tokenizer.name == TOKENIZER_NAME and len(trajs) == 8 and len({t.group_id for t in trajs}) == 2

    replay = asyncio.run(run(RunConfig(trace=str(trace), plan=None, target="miles", python=MILES, watchdog_s=120.0)))
    generate = [q for q in replay.requests if q.endpoint == "/generate"]
    print(f"replay: {len(generate)} generate requests, violations {[v.invariant for v in replay.violations]}")
    assert replay.violations == [] and replay.batch_error is None and replay.hang is None
    assert generate and all(q.trajectory is not None and q.drift is None for q in generate)
    assert replay.fault_events == []
    assert {r.outcome for r in replay.records} == {"completed"} and len(replay.records) == 8
    # the replayed samples are the dump's (members of a group are told apart by arrival order: compare per group)
    recorded = {t.id: t for t in trajs}

    def per_group(items: list[tuple[str, list[int], list[float] | None]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for group, ids, logprobs in items:
            out.setdefault(group, []).append((ids, logprobs))
        return {g: sorted(v, key=repr) for g, v in out.items()}

    dumped = per_group([(t.group_id, t.turns[0].response.output_ids, t.turns[0].response.logprobs) for t in trajs])
    replayed = per_group([(recorded[r.trajectory].group_id, r.response_ids, r.logprobs) for r in replay.records])
    assert replayed == dumped
