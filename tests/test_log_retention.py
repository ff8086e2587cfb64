"""A long-lived server's logs stay bounded in memory and lose nothing: request-log rows and fault events past the window
spill to --log-dir and are read back whole (/bench/requests, requests.csv); served tokens past it are let go, and asking
for them says so. A run's logs (no window) are unchanged."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.records.fault_log_spill import SpilledFaultLog
from bench.records.request_log import Evicted, RequestLog, RequestRecord
from bench.records.served_tokens import EvictedEntry, ServedTokens
from bench.replay import pack
from bench.server import BenchServer, ServerThread
from bench.server.limits import Limits
from faults import plan_from_specs
from faults.log import FaultEvent
from tests.server_helpers import request, turn_input


def _settled(seq_hint: int) -> RequestRecord:
    record = RequestRecord(started=float(seq_hint), endpoint="/generate")
    record.latency_s = 0.001
    return record


def test_a_spilling_log_keeps_its_window_in_memory_and_reads_every_row_back(tmp_path: Path) -> None:
    log = RequestLog()
    log.retain(100, tmp_path)
    for i in range(1_000):
        log.append(_settled(i))
    assert len(log) == 1_000 and len(log.records) < 125 and log.chunks and log.dropped == 0
    assert [row["seq"] for row in log.rows()] == list(range(1_000))
    assert [row["seq"] for row in log.rows(950)] == list(range(950, 1_000))
    assert [row["seq"] for row in log.rows(10)][:2] == [10, 11]  # from inside a chunk on disk
    frame = pd.read_csv(log.write_csv(tmp_path / "requests.csv"))
    assert frame["seq"].tolist() == list(range(1_000)) and frame["started"].tolist()[:3] == [0.0, 1.0, 2.0]


def test_a_request_in_flight_is_not_spilled_before_it_is_answered(tmp_path: Path) -> None:
    log = RequestLog()
    log.retain(10, tmp_path)
    pending = RequestRecord(started=0.0, endpoint="/generate")
    log.append(pending)
    for i in range(13):  # past the window and its chunk, less than half a window past it
        log.append(_settled(i))
    assert log.records[0] is pending and not log.chunks  # it holds the chunk back
    pending.latency_s, pending.status = 0.5, 200
    for i in range(5):
        log.append(_settled(i))
    assert log.chunks and next(log.rows())["status"] == 200  # spilled once answered, as answered


def test_without_a_spill_folder_old_rows_are_dropped_and_asking_for_them_says_so() -> None:
    log = RequestLog()
    log.retain(10)
    for i in range(100):
        log.append(_settled(i))
    assert log.dropped >= 80 and log.first_kept == log.dropped
    with pytest.raises(Evicted, match=r"rows before seq \d+ were dropped .*--log-dir"):
        log.rows(5)
    assert [row["seq"] for row in log.rows(log.first_kept)][-1] == 99


def _block_next_chunk(folder: Path, stem: str, first: int) -> None:
    """Writing the chunk starting at row `first` fails (a folder holds its name: fails even for root)."""
    (folder / f"{stem}-{first:012d}.jsonl" / "x").mkdir(parents=True)


def test_after_spilling_fails_old_rows_are_dropped_and_counted_so_memory_stays_bounded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A full disk mid-serve: rows past the window are dropped and counted, as without --log-dir. (They stayed in
    memory, and every later append walked them all: the log grew without bound and each request cost more.)"""
    spill = tmp_path / "spill"
    log = RequestLog()
    log.retain(100, spill)
    for i in range(300):
        log.append(_settled(i))
    spilled = log.first_seq
    assert spilled > 0 and log.chunks and log.dropped == 0
    _block_next_chunk(spill, "requests", spilled)
    for i in range(20_000):
        log.append(_settled(i))
        assert len(log.records) < 125
    assert log.spill_failure and log.dropped_from == spilled and log.dropped == log.first_seq - spilled > 19_000
    assert capsys.readouterr().err.count("warning:") == 1  # said once
    seqs = [row["seq"] for row in log.rows()]
    assert seqs == list(range(spilled)) + list(range(log.first_seq, 20_300))  # the chunks, then the kept rows
    with pytest.raises(Evicted, match=r"rows before seq \d+ were dropped .*spilling them to disk failed"):
        log.rows(spilled + 1)
    assert [row["seq"] for row in log.rows(log.first_seq)][0] == log.first_seq


def test_after_spilling_fails_fault_events_are_dropped_and_counted(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    log = SpilledFaultLog(100, spill)

    def event(i: int) -> FaultEvent:
        return FaultEvent("r", "abort", f"t{i}", None, 0, 1, "/generate", str(i), 0.0, "aborted")

    for i in range(300):
        log.append(event(i))
    spilled = log.first
    _block_next_chunk(spill, "faults", spilled)
    for i in range(20_000):
        log.append(event(i))
        assert len(log.events) < 125
    assert log.spill_failure and log.dropped == log.first - spilled > 19_000 and log.fired_rules() == {"r"}
    assert len(log.as_dicts()) == spilled + len(log.events)


def test_an_unbounded_log_is_a_run_s_log_as_before() -> None:
    log = RequestLog()
    for i in range(5_000):
        log.append(_settled(i))
    assert len(log.records) == 5_000 and log.first_kept == 0 and not log.chunks


def test_served_tokens_past_the_window_are_let_go_with_their_tokens() -> None:
    store, log = ServedTokens(), RequestLog()
    store.retain(50)
    first = None
    for cycle in range(40):  # the same 10-turn trajectory again and again, as a soak sends it
        prompt: list[int] = [1, 2, 3]
        for turn in range(10):
            record = RequestRecord(0.0, "/generate", trajectory="t", group="g", turn=turn, attempt=cycle + 1)
            log.append(record)
            store.begin(record, pack(prompt))
            answer = [100 + turn] * 20
            store.finish(record, prompt, answer, [-0.25] * 20, "v")
            if first is None:
                first = store.entry_of(record)
            if turn:
                assert record.continues == record.seq - 1  # the previous turn, still kept
            prompt = prompt + answer + [7]
    assert len(store) == 400 and len(store.entries) < 63 and store.evicted >= 338
    assert len(store.ids) <= 63 * 20  # the tokens went too
    assert sum(len(v) for v in store._by_prompt_len["t"].values()) == len(store.entries)
    assert len(store.of_trajectory("t")) == len(store.entries)
    last = store.entries[-1]
    assert [list(store.tokens(e))[0] for e in store.chain(last)] == list(range(100, 110))
    assert first is not None and first.index < store.entries[0].index
    with pytest.raises(EvictedEntry, match=r"seq 0 were let go: the server keeps the latest 50"):
        store.tokens(first)


def test_a_bounded_server_reads_every_row_back_and_its_memory_stays_in_the_window(tmp_path: Path) -> None:
    limits = Limits(keep_requests=40)
    plan = plan_from_specs(["stale_weight_version:p=1/2"], 3)  # many events, every answer whole
    with ServerThread("agentic-500", limits=limits, spill_dir=tmp_path, plan=plan) as server:
        store = server.context.store
        sent = 0
        for trajectory in store.trajectories[:30]:
            for turn in range(len(trajectory.turns)):
                request(server.url, "/generate", {"input_ids": turn_input(trajectory, turn),
                                                  "sampling_params": dict(trajectory.first_sampling_params)},
                        headers={"X-Bench-Trajectory": trajectory.id})
                sent += 1
        ctx = server.context
        assert len(ctx.log) == sent and len(ctx.log.records) < 50 and ctx.log.chunks
        assert len(ctx.served.entries) < 50 and ctx.served.evicted > 0
        reply = request(server.url, "/bench/requests")
        rows = reply.json()
        assert reply.status == 200 and [row["seq"] for row in rows] == list(range(sent + 1))  # its own row last
        assert rows[-1]["endpoint"] == "/bench/requests"
        assert rows[0]["trajectory"] == store.trajectories[0].id and reply.headers["x-bench-log-dropped"] == "0"
        tail = request(server.url, f"/bench/requests?since={sent - 2}").json()
        assert [row["seq"] for row in tail] == [sent - 2, sent - 1, sent, sent + 1]
        assert request(server.url, "/bench/requests?since=-1").status == 400
        faults = request(server.url, "/bench/faults")
        events = faults.json()["events"]
        assert len(events) == len(ctx.faults.log) > 60 and len(ctx.faults.log.events) < 50
        assert faults.headers["x-bench-faults-dropped"] == "0"
        assert ctx.faults.never_fired() == []


def test_refused_requests_do_not_hold_the_served_window_open() -> None:
    """A request refused before it was played (here the engine's context-length 400) is over all the same: it leaves
    the window in its turn. (Only played entries did: refusals held it open to twice its size.)"""
    plan = plan_from_specs(["context_length_error:p=1/2"], 5)
    with ServerThread("agentic-500", limits=Limits(keep_requests=40), plan=plan) as server:
        statuses = set()
        for trajectory in server.context.store.trajectories[:20]:
            for turn in range(len(trajectory.turns)):
                statuses.add(request(server.url, "/generate", {
                    "input_ids": turn_input(trajectory, turn),
                    "sampling_params": dict(trajectory.first_sampling_params)},
                    headers={"X-Bench-Trajectory": trajectory.id}).status)
        assert {200, 400} <= statuses and len(server.context.log) > 120
        assert len(server.context.served.entries) < 50 and len(server.context.log.records) < 50


def test_a_bounded_server_without_a_log_dir_answers_410_for_dropped_rows() -> None:
    with ServerThread("rlvr-500", limits=Limits(keep_requests=8)) as server:
        for _ in range(30):
            assert request(server.url, "/health").status == 200
        first = server.context.log.first_kept
        reply = request(server.url, "/bench/requests?since=0")
        assert reply.status == 410 and reply.json()["first_kept"] == first and "--log-dir" in reply.json()["error"]
        kept = request(server.url, "/bench/requests")
        first = int(kept.headers["x-bench-log-first-seq"])  # this request's own row came on top
        assert kept.status == 200 and kept.json()[0]["seq"] == first > 0
        assert kept.headers["x-bench-log-dropped"] == str(first)


def test_a_bounded_server_without_a_log_dir_says_how_many_fault_events_it_dropped() -> None:
    """`/bench/faults` answers the events kept; `X-Bench-Faults-Dropped` counts the ones gone, as
    `X-Bench-Log-Dropped` does for request rows: kept and dropped add up to every event that fired."""
    plan = plan_from_specs(["stale_weight_version:p=1/2"], 3)
    with ServerThread("agentic-500", limits=Limits(keep_requests=20), plan=plan) as server:
        for trajectory in server.context.store.trajectories[:20]:
            for turn in range(len(trajectory.turns)):
                request(server.url, "/generate", {"input_ids": turn_input(trajectory, turn),
                                                  "sampling_params": dict(trajectory.first_sampling_params)},
                        headers={"X-Bench-Trajectory": trajectory.id})
        log = server.context.faults.log
        reply = request(server.url, "/bench/faults")
        dropped = int(reply.headers["x-bench-faults-dropped"])
        assert reply.status == 200 and dropped == log.dropped > 0
        assert len(reply.json()["events"]) + dropped == len(log) > 40


def test_an_api_server_keeps_everything_unless_told() -> None:
    assert BenchServer("rlvr-500").context.log.window is None


@pytest.mark.parametrize("keep", [5])
def test_serve_spills_while_serving_and_writes_every_row_at_shutdown(tmp_path: Path, keep: int) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--trace", "rlvr-500", "--port", "0",
                                "--keep-requests", str(keep), "--log-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://[\d.:]+) ", process.stdout.readline()).group(1)  # type: ignore[union-attr]
        for _ in range(40):
            assert request(url, "/health").status == 200
        assert list((tmp_path / "spill").glob("requests-*.jsonl"))  # on disk while serving
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    frame = pd.read_csv(tmp_path / "requests.csv")
    assert frame["seq"].tolist() == list(range(40)) and "stopped after 40 requests" in out
    assert not (tmp_path / "spill").exists()  # every chunk is in requests.csv now


def test_serve_refuses_a_keep_requests_below_one() -> None:
    run = subprocess.run([sys.executable, "-m", "bench", "serve", "--keep-requests", "0", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--keep-requests" in run.stderr
