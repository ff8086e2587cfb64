"""Synthetic traces: deterministic, self-consistent with the tokenizer, shaped like the real thing."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.synth import SynthError, synthesize
from bench.synth.agentic import TOOLS
from bench.tokenizer import load_tokenizer
from bench.trace import Trajectory, open_trace, validate_trace
from bench.trace.shipped import SHIPPED_TRACES, shipped_trace

tok = load_tokenizer()


def _trajectories(path: Path) -> list[Trajectory]:
    with open_trace(path) as reader:
        return list(reader)


@pytest.mark.parametrize("kind", ["rlvr", "agentic"])
def test_same_seed_same_bytes(tmp_path: Path, kind: str) -> None:
    a = synthesize(kind, 8, 3, tmp_path / "a.jsonl.gz")
    b = synthesize(kind, 8, 3, tmp_path / "b.jsonl.gz")
    c = synthesize(kind, 8, 4, tmp_path / "c.jsonl.gz")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_a_smaller_trace_is_a_prefix_of_a_larger_one(tmp_path: Path) -> None:
    small = _trajectories(synthesize("agentic", 4, 5, tmp_path / "s.jsonl"))
    large = _trajectories(synthesize("agentic", 12, 5, tmp_path / "l.jsonl"))
    assert small == large[:4]


@pytest.mark.parametrize("fixture", ["small_rlvr", "small_agentic"])
def test_tokens_are_self_consistent(request: pytest.FixtureRequest, fixture: str) -> None:
    path: Path = request.getfixturevalue(fixture)
    assert list(validate_trace(path)) == []  # includes: texts are what their ids decode to
    for trajectory in _trajectories(path):
        assert tok.decode(trajectory.prompt.ids) == trajectory.prompt.text
        for turn in trajectory.turns:
            response = turn.response
            assert response.logprobs is not None and len(response.logprobs) == len(response.output_ids)
            assert all(math.isfinite(v) and v <= 0 for v in response.logprobs)
            stop = response.finish_reason and response.finish_reason.get("matched") == tok.eos_token_id
            body = response.output_ids[:-1] if stop else response.output_ids
            assert tok.decode(body) == response.text


def test_rlvr_groups_share_a_prompt_and_rewards_follow_answers(small_rlvr: Path) -> None:
    records = _trajectories(small_rlvr)
    by_group: dict[str, list[Trajectory]] = {}
    for record in records:
        by_group.setdefault(record.group_id, []).append(record)
    assert [len(members) for members in by_group.values()] == [4, 4]
    for members in by_group.values():
        assert len({tuple(m.prompt.ids) for m in members}) == 1
    for record in records:
        assert len(record.turns) == 1
        right = f"\\boxed{{{record.metadata['answer']}}}." in record.turns[0].response.text
        finished = record.turns[0].response.finish_reason["type"] == "stop"
        assert record.reward == (1.0 if right and finished else 0.0)


def test_agentic_context_decodes_to_the_rendered_conversation(small_agentic: Path) -> None:
    """Appended ids + outputs rebuild exactly what the chat template renders for the same turns."""
    for trajectory in _trajectories(small_agentic):
        messages = list(trajectory.prompt.messages or [])
        for index, (turn, ids) in enumerate(zip(trajectory.turns, trajectory.iter_request_input_ids())):
            assert ids is not None
            rendered = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
            assert tok.decode(ids) == rendered, (trajectory.id, index)
            if turn.response.error is not None or turn.response.finish_reason["type"] != "stop":
                assert index == len(trajectory.turns) - 1
                break
            content = turn.response.text.split("\n<tool_call>\n", 1)[0]
            messages.append({"role": "assistant", "content": content, "tool_calls": [
                {"function": {"name": c.name, "arguments": c.arguments}} for c in turn.tool_calls]})
            messages.extend({"role": "tool", "content": o.text} for o in turn.tool_outputs)


def test_shipped_agentic_trace_has_the_promised_shape() -> None:
    records = _trajectories(shipped_trace("agentic-500"))
    assert len(records) == 500
    planned = [r.metadata["planned_turns"] for r in records]
    assert min(planned) >= 5 and max(planned) <= 50 and max(planned) >= 25
    assert statistics.median(len(r.turns) for r in records) >= 8
    with open_trace(shipped_trace("agentic-500")) as reader:
        context = reader.header.context_length
    tool_tokens = [o.tokens for r in records for t in r.turns for o in t.tool_outputs]
    median = statistics.median(tool_tokens)
    assert max(tool_tokens) > context > 20 * median  # long tail, reaching past the budget
    assert sum(size > context / 2 for size in tool_tokens) >= 5
    overflows = [r for r in records if r.turns[-1].response.error is not None]
    assert overflows and all(r.turns[-1].response.error.status == 400 for r in overflows)
    assert all("longer than the model's context length" in r.turns[-1].response.error.message for r in overflows)
    totals = [t.response.latency.total for r in records for t in r.turns]
    assert statistics.quantiles(totals, n=100)[98] > 5 * statistics.median(totals)  # long-tailed latency


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_shipped_traces_regenerate_byte_for_byte(tmp_path: Path, name: str) -> None:
    file, kind, n, seed = SHIPPED_TRACES[name]
    shipped = shipped_trace(name)
    with open_trace(shipped) as reader:
        recorded_faker = reader.header.source.details["faker"]
    fresh = synthesize(kind, n, seed, tmp_path / file)
    assert fresh.read_bytes() == shipped.read_bytes(), (
        f"{name} no longer regenerates byte for byte (shipped with faker {recorded_faker}); run `make traces`")


@pytest.mark.parametrize("args,message", [
    (["--kind", "rlvr", "--n", "10", "--seed", "1"], "must be a positive multiple of the group size 4"),
    (["--kind", "rlvr", "--n", "0", "--seed", "1"], "--n must be positive"),
    (["--kind", "agentic", "--n", "4", "--seed", "1", "--context-length", "10"], "at least 256 tokens"),
    (["--kind", "rlvr", "--n", "4", "--seed", "1", "--turns", "20"], "--turns applies to agentic traces only"),
    (["--kind", "agentic", "--n", "4", "--seed", "1", "--tool-output-tokens", "0"],
     "--tool-output-tokens must be positive"),
])
def test_synth_rejects_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "x.jsonl"
    run = subprocess.run([sys.executable, "-m", "bench", "synth", *args, "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 2 and message in run.stderr and not out.exists()


def test_synth_refuses_an_out_it_cannot_write_before_any_work(tmp_path: Path) -> None:
    """Named as given (not as the temporary file beside it), before a trajectory is made."""
    for out, message in ((tmp_path / "missing" / "x.jsonl", f"its folder {tmp_path / 'missing'} does not exist"),
                         (tmp_path, "is a folder, not a file")):
        run = subprocess.run([sys.executable, "-m", "bench", "synth", "--kind", "rlvr", "--n", "4", "--seed", "1",
                              "--out", str(out)], capture_output=True, text=True)
        assert run.returncode == 2 and f"--out {out}: {message}" in run.stderr, run.stderr
        assert "synth: kind=" not in run.stderr and ".partial" not in run.stderr


def test_unknown_kind_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(SynthError, match="valid kinds: agentic, retool, rlvr"):
        synthesize("chat", 4, 1, tmp_path / "x.jsonl")


def test_synth_command_prints_the_seed(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl.gz"
    run = subprocess.run([sys.executable, "-m", "bench", "synth", "--kind", "rlvr", "--n", "4", "--seed", "9",
                          "--out", str(out)], capture_output=True, text=True, check=True)
    assert "seed 9" in run.stdout and "seed=9" in run.stderr
    with open_trace(out) as reader:
        assert reader.header.source.details == {"kind": "rlvr", "n": 4, "seed": 9, "group_size": 4,
                                                "faker": reader.header.source.details["faker"]}


def test_agentic_turns_and_tool_output_tokens_shape_the_trace(tmp_path: Path) -> None:
    """Every trajectory plans the turns asked for (ending earlier only on an overflow or a cut answer), tool outputs
    grow with their median, and the header says how the trace was shaped."""
    plain = synthesize("agentic", 8, 3, tmp_path / "plain.jsonl")
    shaped = synthesize("agentic", 8, 3, tmp_path / "shaped.jsonl", turns=12, tool_output_tokens=600,
                        context_length=65536)
    with open_trace(shaped) as reader:
        assert reader.header.source.details["turns"] == 12 and reader.header.source.details["tool_output_tokens"] == 600
        trajectories = list(reader)
    assert all(t.metadata["planned_turns"] == 12 for t in trajectories)
    assert all(len(t.turns) == 12 for t in trajectories if t.metadata["outcome"] == "completed")
    assert sum(t.metadata["outcome"] == "completed" for t in trajectories) >= 6
    assert shaped.stat().st_size > 2 * plain.stat().st_size  # 2.6x here
