"""Trace format v1: lossless round trip, precise errors, streaming reads."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from bench.testing.strategies import trace_headers, trajectories
from bench.trace import (
    SCHEMA_VERSION,
    TraceFormatError,
    TraceVersionError,
    TraceWriter,
    Trajectory,
    open_trace,
    validate_trace,
    write_trace,
)
from tests.conftest import read_lines, write_lines


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(header=trace_headers(), records=__import__("hypothesis").strategies.lists(trajectories(), max_size=4,
                                                                                  unique_by=lambda t: t.id))
def test_round_trip_is_lossless(tmp_path: Path, header, records: list[Trajectory]) -> None:
    for suffix in (".jsonl", ".jsonl.gz"):
        path = write_trace(tmp_path / f"t{suffix}", header, records)
        with open_trace(path) as reader:
            assert reader.header == header
            assert list(reader) == records
        assert list(validate_trace(path)) == []


def _set(path: str, value: object) -> Callable[[dict], None]:
    """A mutation that sets the field at dotted `path` (list indexes as numbers)."""
    def mutate(record: dict) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        target = record
        for key in parents:
            target = target[key]
        target[last] = value
    return mutate


def _delete(key: str) -> Callable[[dict], None]:
    return lambda record: record.pop(key)


def _rename(old: str, new: str) -> Callable[[dict], None]:
    def mutate(record: dict) -> None:
        record[new] = record.pop(old)
    return mutate


# (name, record line mutated, mutation, field reported, words of the message)
MALFORMATIONS = [
    ("missing field", 2, _delete("turns"), "turns", "missing required field"),
    ("wrong type", 3, _set("turns.0.response.output_ids.1", "7"), "turns[0].response.output_ids[1]",
     "Expected int, got str"),
    ("unknown field", 2, _rename("metadata", "metdata"), "metdata", "unknown field"),
    ("logprobs shorter than ids", 4, lambda r: r["turns"][1]["response"]["logprobs"].pop(),
     "turns[1].response.logprobs", "entries for"),
    ("positive logprob", 2, _set("turns.0.response.logprobs.3", 0.5), "turns[0].response.logprobs[3]",
     "must be finite and <= 0"),
    ("completion count", 2, _set("turns.0.response.completion_tokens", 1), "turns[0].response.completion_tokens",
     "output ids"),
    ("token outside vocabulary", 3, _set("prompt.ids.5", 10**6), "prompt.ids[5]", "outside the vocabulary"),
    ("two input forms", 2, _set("turns.0.request.text", "hi"), "turns[0].request", "exactly one of"),
    ("tool output size", 2, _set("turns.0.tool_outputs.0.bytes", 1), "turns[0].tool_outputs[0].bytes",
     "UTF-8 bytes"),
    ("unknown tool call", 2, _set("turns.0.tool_outputs.0.call_id", "nope"), "turns[0].tool_outputs[0].call_id",
     "names no tool call"),
    ("finish reason type", 2, _set("turns.0.response.finish_reason", {"type": "done"}),
     "turns[0].response.finish_reason.type", "must be one of"),
    ("prompt token count", 2, _set("turns.1.response.prompt_tokens", 3), "turns[1].response.prompt_tokens",
     "input ids"),
    ("negative latency", 5, _set("turns.0.response.latency.ttft", -1.0), "turns[0].response.latency.ttft",
     "non-negative"),
    ("duplicate id", 4, lambda r: r.update(id="g00000-0"), "id", "duplicate trajectory id"),
    ("header type", 1, _set("context_length", "8k"), "context_length", "Expected int, got str"),
]


@pytest.mark.parametrize("name,line,mutate,field,words", MALFORMATIONS, ids=[m[0] for m in MALFORMATIONS])
def test_malformed_record_is_named_by_line_and_field(small_agentic: Path, tmp_path: Path, name: str, line: int,
                                                     mutate: Callable[[dict], None], field: str, words: str) -> None:
    records = read_lines(small_agentic)
    mutate(records[line - 1])
    path = write_lines(tmp_path / "bad.jsonl", records)
    prefix = f"{path}:{line}: {field}: "
    problems = [str(p) for p in validate_trace(path)]
    assert len(problems) == 1, problems
    assert problems[0].startswith(prefix) and words in problems[0], problems[0]
    with pytest.raises(TraceFormatError) as raised:
        with open_trace(path) as reader:
            list(reader)
    assert str(raised.value) == problems[0]


@pytest.mark.parametrize("name,lines,line,field,words", [
    ("not json", lambda r: r[:2] + ["{oops"] + r[3:], 3, "<json>", "not valid JSON"),
    ("empty line", lambda r: r[:2] + [""] + r[2:], 3, "<line>", "empty line"),
    ("no header", lambda r: r[1:], 1, "type", "must be the header"),
    ("empty file", lambda r: [], 1, "<file>", "empty trace"),
])
def test_broken_lines_are_named(small_agentic: Path, tmp_path: Path, name: str, lines, line: int, field: str,
                                words: str) -> None:
    path = tmp_path / "bad.jsonl"
    records = lines(small_agentic.read_text().splitlines())
    path.write_text("".join(r + "\n" for r in records))
    problems = [str(p) for p in validate_trace(path)]
    assert problems and problems[0].startswith(f"{path}:{line}: {field}: ") and words in problems[0], problems


def test_validation_goes_on_after_a_bad_line(small_agentic: Path, tmp_path: Path) -> None:
    records = read_lines(small_agentic)
    records[2]["turns"][0]["response"]["completion_tokens"] = -5
    records[6]["turns"][0]["response"]["logprobs"][0] = 1.0
    lines = [json.dumps(r) for r in records]
    lines[4] = "not json"
    path = write_lines(tmp_path / "bad.jsonl", lines)
    assert [(p.line, p.field) for p in validate_trace(path)] == [
        (3, "turns[0].response.completion_tokens"),
        (3, "turns[0].response.completion_tokens"),
        (5, "<json>"),
        (7, "turns[0].response.logprobs[0]"),
    ]


def test_newer_schema_is_refused_clearly(small_agentic: Path, tmp_path: Path) -> None:
    records = read_lines(small_agentic)
    records[0]["schema_version"] = SCHEMA_VERSION + 1
    records[0]["a_field_from_the_future"] = True
    path = write_lines(tmp_path / "future.jsonl", records)
    with pytest.raises(TraceVersionError, match=rf"{path}:1: schema_version: trace schema version "
                                                rf"{SCHEMA_VERSION + 1} is newer than this rollout-bench reads"):
        open_trace(path)


def test_truncated_gzip_is_named(small_agentic: Path, tmp_path: Path) -> None:
    whole = gzip.compress(small_agentic.read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    problems = list(validate_trace(path))
    assert problems[-1].field == "<file>" and "corrupt or truncated" in problems[-1].message
    with pytest.raises(TraceFormatError, match="corrupt or truncated"):
        with open_trace(path) as reader:
            list(reader)


def test_gzip_is_recognised_by_content_not_name(small_agentic: Path, tmp_path: Path) -> None:
    path = tmp_path / "no-suffix"
    path.write_bytes(gzip.compress(small_agentic.read_bytes()))
    with open_trace(path) as reader, open_trace(small_agentic) as plain:
        assert list(reader) == list(plain)


def test_writer_leaves_nothing_behind_on_failure(small_agentic: Path, tmp_path: Path) -> None:
    with open_trace(small_agentic) as reader:
        header, records = reader.header, list(reader)
    bad = msgspec.structs.replace(records[1], turns=[])
    target = tmp_path / "out.jsonl.gz"
    with pytest.raises(TraceFormatError, match=rf"{target}:3: turns: a trajectory needs at least one turn"):
        with TraceWriter(target, header) as writer:
            writer.write(records[0])
            writer.write(bad)
    assert list(tmp_path.iterdir()) == []


def test_streaming_read_has_bounded_memory(small_agentic: Path, tmp_path: Path) -> None:
    """A trace far larger than the reader's peak memory: reading never holds it whole."""
    lines = small_agentic.read_bytes().splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    line_size = max(len(line) for line in body)
    path = tmp_path / "big.jsonl.gz"
    copies = 120
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(header)
        for copy in range(copies):
            for number, line in enumerate(body):
                record = json.loads(line)
                record["id"] = f"copy{copy}-{number}"
                out.write(json.dumps(record).encode() + b"\n")
    total = sum(len(line) for line in body) * copies
    assert total > 40 * 2**20  # > 40 MiB of JSON
    tracemalloc.start()
    try:
        with open_trace(path) as reader:
            count = sum(1 for _ in reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == copies * len(body)
    assert peak < 20 * line_size and peak < total / 20, (peak, line_size, total)


def test_validate_command_prints_each_problem(small_agentic: Path, tmp_path: Path) -> None:
    records = read_lines(small_agentic)
    records[1]["turns"][0]["response"]["logprobs"][2] = 3.0
    records[3]["group_id"] = ""
    path = write_lines(tmp_path / "bad.jsonl", records)
    run = subprocess.run([sys.executable, "-m", "bench", "validate", str(path), str(small_agentic)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stdout.splitlines() == [
        f"{path}:2: turns[0].response.logprobs[2]: must be finite and <= 0, got 3.0",
        f"{path}:4: group_id: must not be empty",
    ]
    assert f"{small_agentic}: valid" in run.stderr
    ok = subprocess.run([sys.executable, "-m", "bench", "validate", str(small_agentic)], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout == ""


def test_a_lines_ids_are_read_without_decoding_it_when_written_by_the_writer(small_agentic) -> None:  # type: ignore[no-untyped-def]
    """`TraceReader.ids` lets a run of a few trajectories skip the rest of a trace; a line in another key
    order (hand-edited, another writer) is decoded instead, with the same answer."""
    from bench.trace import open_trace

    with open_trace(small_agentic) as reader:
        number, line = next(iter(reader.lines()))
        record = json.loads(line)
        reordered = json.dumps(dict(reversed(list(record.items())))).encode()
        assert reader.ids(number, line) == reader.ids(number, reordered) == (record["id"], record["group_id"])
        assert not reordered.startswith(b'{"type"')


def test_a_raw_prompt_and_its_rendering_are_a_pair(tmp_path: Path) -> None:
    """`prompt.raw` (what a framework that renders its own prompt receives) must occur in `prompt.text` (what it
    sent): a raw prompt from another rendering is named by line and field, in the reader and in validate."""
    from bench.synth import synthesize

    good = synthesize("retool", 4, 1, tmp_path / "retool.jsonl")
    assert list(validate_trace(good)) == []
    records = read_lines(good)
    assert all(r["prompt"]["raw"] in r["prompt"]["text"] for r in records[1:])
    records[2]["prompt"]["raw"] = "What is the greatest common divisor of 12 and 18?"
    records[3]["prompt"]["raw"] = " "
    path = write_lines(tmp_path / "bad.jsonl", records)
    problems = [str(p) for p in validate_trace(path)]
    assert problems == [
        f"{path}:3: prompt.raw: does not occur in prompt.text: the rendered prompt (ids/text) must be the framework's "
        "rendering of this raw prompt (raw starts 'What is the greatest common divisor of 1')",
        f"{path}:4: prompt.raw: must not be empty (leave it out when the framework receives the rendered prompt)",
    ]
    with pytest.raises(TraceFormatError, match=r":3: prompt.raw: does not occur in prompt.text"):
        with open_trace(path) as reader:
            list(reader)


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_a_damaged_gzip_fails_at_the_line_where_line_by_line_reading_fails(small_rlvr: Path, tmp_path: Path,
                                                                            damage: str) -> None:
    """The reader decompresses in bigger pieces than a line at a time; a failing piece loses what it had
    decompressed (short lines, as rlvr's: several). The lines read and the line the error names must still be
    those of reading the stream a line at a time."""
    import zlib

    whole = gzip.compress(small_rlvr.read_bytes())
    path = tmp_path / "damaged.jsonl.gz"
    for tenths in (3, 5):
        cut = len(whole) * tenths // 10
        path.write_bytes(whole[:cut] if damage == "truncated" else whole[:cut] + b"\xff" * 64 + whole[cut + 64:])
        expected: list[bytes] = []
        with gzip.open(path, "rb") as stream:
            with pytest.raises((EOFError, gzip.BadGzipFile, zlib.error)):
                for line in stream:
                    expected.append(line)
        read: list[bytes] = []
        with open_trace(path, check=False) as reader:
            with pytest.raises(TraceFormatError, match="corrupt or truncated") as error:
                for _, line in reader.lines():
                    read.append(line)
        assert len(expected) > 1 and read == expected[1:]  # the header is read on opening
        assert error.value.problem.line == len(expected) + 1
