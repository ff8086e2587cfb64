"""`make bench` smoke tests: each benchmark runs in --quick mode and reports every row with sane numbers.

No timing thresholds here (performance claims live in `make bench`); these check the benchmarks measure
what they say: the four servers answered, the bench server identified every request and the plan's
faults fired, the repro runs were cold and forked as labelled and reproduced the crash, and the load
generator counts answers right whatever their framing.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from benchmarks.http_load import Load, raw_request

ROOT = Path(__file__).resolve().parent.parent


def _bench(module: str, out: Path, *extra: str, results: str | None = None) -> tuple[dict, str]:
    """`--quick` run of a benchmark; its results file (`results`: when not named after the module)."""
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--quick", "--out", str(out), *extra],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    return json.loads((out / f"{results or module}.json").read_text()), done.stdout



@pytest.mark.slow
def test_served_memory_quick_compares_keeping_with_discarding(tmp_path: Path) -> None:
    result, stdout = _bench("served_memory", tmp_path)
    keep, discard = result["rows"]
    assert (keep["store"], discard["store"]) == ("keep", "discard")
    assert keep["served_tokens"] > 0 and keep["served_bytes"] == 12 * keep["served_tokens"]
    assert discard["served_tokens"] == 0 and keep["samples"] == discard["samples"] == 40
    assert keep["requests"] == discard["requests"] > 40  # the same multi-turn run, whatever the store keeps
    assert result["rss_growth_bytes"] == keep["end_rss_bytes"] - discard["end_rss_bytes"]
    assert "the served data" in stdout

@pytest.mark.slow
def test_trace_loading_quick_reports_both_files_with_figures_from_the_measured_values(tmp_path: Path) -> None:
    result, stdout = _bench("trace_loading", tmp_path)
    assert "seed 1" in stdout and "rollout-bench synth --kind agentic" in stdout
    gz, plain, gz_cached, plain_cached = result["rows"]
    assert [r["file"] for r in result["rows"]] == ["gz", "plain", "gz cached", "plain cached"]
    assert gz["file_bytes"] < plain["file_bytes"] == plain["decompressed_bytes"] == result["decompressed_bytes"]
    # the cached rows read the entries a first load wrote, the cold ones never (said by each load, not by timings:
    # 8 trajectories load in milliseconds either way, within a shared machine's noise)
    assert [r["cache_hit"] for row in result["rows"] for r in row["rounds"]] == [False, False, True, True]
    for row in (gz, plain, gz_cached, plain_cached):
        assert row["trajectories"] == 8 and 8 < row["turns"] <= 8 * 5  # multi-turn, at most the planned turns
        rounds = row["rounds"]
        assert len(rounds) == 1 and rounds[0]["wall_s"] > 0 and rounds[0]["peak_rss_bytes"] >= rounds[0]["rss_before_bytes"]
        assert row["wall_s"] == rounds[0]["wall_s"]
        assert row["mb_per_s"] == row["decompressed_bytes"] / 2**20 / row["wall_s"]
        growth = rounds[0]["peak_rss_bytes"] - rounds[0]["rss_before_bytes"]
        assert row["peak_rss_growth_bytes"] == growth and row["memory_ratio"] == growth / row["decompressed_bytes"]
        assert row["speed_aim_holds"] == (row["mb_per_s"] >= 100) and row["memory_aim_holds"] == (row["memory_ratio"] <= 3)
    assert result["big_enough"] is False and "under the 200 MB" in stdout  # a quick run says it is no measurement
    assert (tmp_path / "trace_loading.csv").read_text().count("\n") == 5


@pytest.mark.slow
def test_record_latency_quick_compares_direct_with_recorded(tmp_path: Path) -> None:
    result, stdout = _bench("record_latency", tmp_path)
    direct, recorded = result["rows"]
    assert (direct["arm"], recorded["arm"]) == ("direct", "recorded")
    assert direct["requests"] > 0 and recorded["requests"] > 0 and recorded["median_ms"] > 0
    assert result["recorded_turns"] == recorded["requests"]  # every request through the recorder was recorded
    assert result["added_median_ms"] == round(recorded["median_ms"] - direct["median_ms"], 3)
    assert "added by the recorder" in stdout


@pytest.mark.slow
def test_server_throughput_quick_reports_every_server(tmp_path: Path) -> None:
    result, stdout = _bench("server_throughput", tmp_path)
    rows = {row["server"]: row for row in result["rows"]}
    assert list(rows) == ["bare-bytes", "bare-json", "bench", "bench-plan"]
    for name, row in rows.items():
        assert row["requests_per_s"] > 0 and row["server_cpu_us_per_answer"] > 0, row
        assert row["ratio_to_bare_bytes"] > 0 and row["cost_ratio_to_bare_bytes"] > 0, row
        assert name in stdout
    assert rows["bare-bytes"]["ratio_to_bare_bytes"] == 1.0
    assert rows["bench"]["not_200"] == 0 and rows["bare-json"]["not_200"] == 0
    for kind in ("bench", "bench-plan"):  # replayed, not drifted: the bench did its real work
        seen = result["identified"][kind]
        assert seen["requests"] > 0 and seen["identified"] == seen["requests"] and seen["drifted"] == 0, seen
    assert result["fault_events"] > 0 and result["faults_fired"]  # the engine acted, not only decided
    assert not {"latency", "stall", "slow_first_token"} & set(result["faults_fired"])
    assert result["machine"]["cores"] >= 1 and result["parameters"]["quick"] is True
    assert (tmp_path / "server_throughput.csv").read_text().count("\n") == 5


@pytest.mark.slow
def test_peer_servers_quick_measures_the_bench_chat_route_and_says_why_a_peer_is_missing(tmp_path: Path) -> None:
    """No peer environment here (an empty --peers-dir): their rows say so; the bench's chat route is measured
    beside the ceiling, and its answers to the repeated request are identical but for id and created."""
    result, stdout = _bench("peer_servers", tmp_path, "--peers-dir", str(tmp_path / "no-peers"))
    rows = {row["server"]: row for row in result["rows"]}
    assert list(rows) == ["bare-bytes", "bench-chat", "fakellm", "fakellm-quiet", "mockllm", "mockllm-quiet",
                          "llmock", "llmock-quiet"]
    for name in ("bare-bytes", "bench-chat"):
        row = rows[name]
        assert row["requests_per_s"] > 0 and row["server_cpu_us_per_answer"] > 0 and row["not_200"] == 0, row
        assert 0 < row["loadgen_cpu_share"] and row["spread"] == 0.0 and len(row["rounds_requests_per_s"]) == 1, row
        assert row["reply_body_bytes"] > 0 and name in stdout
    assert rows["bare-bytes"]["ratio_to_bare_bytes"] == 1.0 and rows["bench-chat"]["ratio_to_bench_chat"] == 1.0
    for name in ("fakellm", "fakellm-quiet", "mockllm", "mockllm-quiet", "llmock", "llmock-quiet"):
        assert rows[name]["note"] == "not built: make bench-peers" and rows[name]["requests_per_s"] is None, rows[name]
    assert stdout.count("not built: make bench-peers") >= 3  # said, not silently skipped
    bench = result["checks"]["bench-chat"]
    assert (bench["requests"], bench["repeats"], bench["statuses"]) == (3, 3, [200])
    assert bench["volatile"] == ["id", "created"] and bench["equal_modulo_volatile"] is True
    assert bench["distinct_bodies_per_request"] == [3, 3, 3]  # the id changes, nothing else
    assert bench["distinct_masked_bodies_per_request"] == [1, 1, 1]
    assert result["requests"] == 500 and result["bench_token_ids"] > 0
    assert 0 < result["bench_logprob_bytes"] < result["fixed_reply_bytes"]
    seen = result["identified"]  # every request replayed as its trajectory's turn 0, none drifted
    assert seen["requests"] > 500 and seen["identified"] == seen["requests"] and seen["drifted"] == 0, seen
    assert (tmp_path / "peer_servers.csv").read_text().count("\n") == 9


@pytest.mark.slow
def test_peer_servers_quick_runs_a_built_peer_with_the_configured_reply(tmp_path: Path) -> None:
    """With `make bench-peers` done, fakellm answers the bench's reply text and is measured in both modes."""
    peers_dir = ROOT / ".bench"
    if not (peers_dir / "fakellm" / ".built").exists():
        pytest.skip(f"fakellm's environment is not built ({peers_dir}/fakellm): make bench-peers")
    result, stdout = _bench("peer_servers", tmp_path, "--peers", "fakellm")
    rows = {row["server"]: row for row in result["rows"]}
    assert list(rows) == ["bare-bytes", "bench-chat", "fakellm", "fakellm-quiet"]
    for name in ("fakellm", "fakellm-quiet"):
        check = result["checks"][name]
        assert check["answers_configured_text"] is True and check["statuses"] == [200], check
        assert rows[name]["requests_per_s"] > 0 and rows[name]["not_200"] == 0, rows[name]
        assert rows[name]["reply_body_bytes"] < rows["bench-chat"]["reply_body_bytes"]  # text alone
    assert rows["fakellm"]["access_log_lines"] > 0 and rows["fakellm-quiet"]["access_log_lines"] == 0
    assert result["peers"]["fakellm"]["version"] == "0.3.5" and "fakellm 0.3.5" in stdout


@pytest.mark.slow
def test_scale_curve_quick_runs_every_cell_and_fits_the_bench_cpu(tmp_path: Path) -> None:
    """A 2 x 2 grid: each cell's run is real (every request replayed, none drifted), more turns mean more
    requests, the bench's CPU is its own (the worker's is apart), and the table, fit and plot are written."""
    result, stdout = _bench("scale_curve", tmp_path)
    rows = result["rows"]
    assert [(r["trajectories"], r["turns_planned"]) for r in rows] == [(10, 1), (10, 3), (20, 1), (20, 3)]
    for row in rows:
        assert row["exit"] == 0 and row["violations"] == [] and row["drifted"] == 0, row
        assert row["trajectories"] <= row["requests"] <= row["trajectories"] * row["turns_planned"], row
        assert 0 < row["run_cpu_s"] < row["process_cpu_s"] and row["target_cpu_s"] > 0, row
        assert row["run_cpu_us_per_request"] == pytest.approx(row["run_cpu_s"] / row["requests"] * 1e6, rel=0.02)
        assert row["peak_rss_mb"] > 50 and row["wall_s"] > row["run_s"] > 0 and row["trace_mb"] > 0, row
    assert rows[1]["requests"] > rows[0]["requests"] and rows[3]["requests"] > rows[2]["requests"]
    line = result["fit"]["run_cpu"]
    assert line["us_per_request"] > 0 and len(line["relative_deviation"]) == 4 and result["fit"]["cells"] == 4
    assert "µs x requests" in stdout and (tmp_path / "scale_curve.csv").read_text().count("\n") == 5
    assert (tmp_path / "scale_curve.md").read_text().count("\n| ") == 5  # header and four cells
    assert (tmp_path / "scale_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_scale_curve_run_cpu_quick_measures_the_issue_run_and_splits_it_by_phase(tmp_path: Path) -> None:
    """`--run-cpu --quick`: issue 18's run (seed-004, ref-tool-loop:fixed) over 20 of agentic-500's trajectories, once
    plain and once split by phase. The split accounts for every request on the /generate fast path (each step called
    once per request), the one-off phases once, and leaves a positive rest; the figures are the run's own summary's."""
    result, stdout = _bench("scale_curve", tmp_path, "--run-cpu", results="run_cpu")
    (row,) = result["rows"]
    assert row["exit"] == 0 and row["violations"] == [] and row["drifted"] == 0, row
    assert 20 < row["requests"] and 0 < row["run_cpu_s"] < row["process_cpu_s"] and row["target_cpu_s"] > 0, row
    assert row["run_cpu_us_per_request"] == pytest.approx(row["run_cpu_s"] / row["requests"] * 1e6, rel=0.02)
    assert row["bench_to_target_cpu"] == pytest.approx(row["run_cpu_s"] / row["target_cpu_s"], rel=0.01)
    split = result["split"]
    assert split["requests"] == row["requests"] and split["round"] == "phases"
    calls = {p["phase"]: p["calls"] for p in split["phases"]}
    assert calls["trace load (decode, check, pack)"] == 1 and calls["invariants (check_all)"] == 1
    assert calls["worker lines decoded (records)"] >= 20  # hello, 20 records, done
    for step in ("body decoded, ids packed and range-checked", "identified", "request log row",
                 "served-token entry (prompt hashed, parent found)"):
        assert calls[f"/generate: {step}"] == split["requests"], step
    rest = result["phase_table"][-2]
    assert rest["phase"].startswith("the rest") and rest["cpu_s"] > 0
    assert result["verdict"]["aim_us_per_request"] == 250 and "µs of bench CPU per request" in stdout
    assert (tmp_path / "run_cpu.md").read_text().count("\n| ") >= 2 + len(split["phases"])


@pytest.mark.slow
def test_scale_curve_run_cpu_warm_reads_the_trace_back_from_a_cache_of_its_own(tmp_path: Path) -> None:
    """`--trace-cache warm`: the runs read agentic-500 back from a cache a first load filled, so the split run's trace
    load costs less than a cold run's; the user's cache is not involved (the folder is the benchmark's own)."""
    loads = {}
    for mode in ("cold", "warm"):
        result, _ = _bench("scale_curve", tmp_path / mode, "--run-cpu", "--trace-cache", mode, results="run_cpu")
        assert result["parameters"]["trace_cache"] == mode
        (loads[mode],) = [p["cpu_s"] for p in result["split"]["phases"] if p["phase"].startswith("trace load")]
    assert 0 < loads["warm"] < loads["cold"], loads


@pytest.mark.slow
def test_repro_warm_quick_times_a_cold_and_a_forked_repro(tmp_path: Path) -> None:
    result, stdout = _bench("repro_warm", tmp_path)
    assert result["parameters"]["target"] == "ref-gather"
    rows = {row["mode"]: row for row in result["rows"]}
    assert list(rows) == ["cold", "warm"]
    for row in rows.values():
        assert row["wall_s"] > 0 and row["reproduced"] is True, row
    assert [(r["mode"], r["forked_from_warm"]) for r in result["runs"]] == [("cold", False), ("warm", True)]
    assert all(r["violations"] == ["batch_survival"] for r in result["runs"])
    assert result["warm_worker_start_s"] > 0 and "ratio to cold" in stdout


def test_invariant_scaling_quick_times_every_check_at_two_sizes_and_counts_passes(tmp_path: Path) -> None:
    """Quick mode (20 and 200 trajectories): a row per check with its CPU time at both sizes, every sample a
    provenance match (the checks ran their full path), and every check going over the records, requests and
    fault events as many times at 10x the run as at 1x: linear in them (the pass count, not a timing threshold)."""
    from bench.invariants import INVARIANTS

    result, stdout = _bench("invariant_scaling", tmp_path)
    steps = [row["step"] for row in result["rows"]]
    assert steps == ["fault_reach", *INVARIANTS, "provenance_labels", "all"]
    for row in result["rows"]:
        assert row["small_cpu_s"] >= 0 and row["large_cpu_s"] >= 0, row
    everything = result["rows"][-1]
    assert everything["large_cpu_s"] > everything["small_cpu_s"] > 0
    assert everything["per_trajectory_ratio"] == pytest.approx(
        everything["large_us_per_trajectory"] / everything["small_us_per_trajectory"])
    small, large = result["sizes"]["20"], result["sizes"]["200"]
    assert (small["trajectories"], large["trajectories"]) == (20, 200)
    assert small["matched"] == 20 and large["matched"] == 200  # every sample holds what it was served
    assert large["requests"] > 10 * 20 * 4 - 20 and large["fault_events"] > 0 and large["served_tokens"] > 0
    assert result["violations"] == []
    assert set(result["passes"]["20"]) == {"fault_reach", *INVARIANTS}
    assert result["passes"]["20"] == result["passes"]["200"] and result["passes_grow"] == []
    assert "the same at both sizes for every step" in stdout
    assert (tmp_path / "invariant_scaling.csv").read_text().count("\n") == len(steps) + 1


def test_counting_passes_catches_a_check_that_scans_the_fault_log_once_per_record(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the scaling benchmark's pass count would say of a quadratic check (the per-record scan `faults_for`
    used to make): more passes over the fault events at 10x the run, where a timing at quick sizes hides it."""
    from bench.invariants import INVARIANTS
    from benchmarks.invariant_scaling import build_run, count_passes

    def quadratic(view):  # type: ignore[no-untyped-def]
        return [e for r in view.records for e in view.fault_events if e.trajectory == r.trajectory and False]

    monkeypatch.setitem(INVARIANTS, "quadratic", quadratic)
    small, large = count_passes(build_run(6, 3, seed=1)), count_passes(build_run(60, 3, seed=1))
    assert (small["quadratic"]["fault_events"], large["quadratic"]["fault_events"]) == (6, 60)
    assert all(small[step] == large[step] for step in small if step != "quadratic")


def test_the_load_generator_counts_answers_of_every_framing_and_dropped_connections() -> None:
    """Content-Length, chunked and error answers each count once; a dropped connection counts as dropped."""
    async def answer(request: web.Request) -> web.StreamResponse:
        kind = (await request.read()).decode()
        if kind == "chunked":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b'{"a":')
            await response.write(b"1}")
            await response.write_eof()
            return response
        if kind == "drop":
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError
        if kind == "error":
            return web.json_response({"error": "x"}, status=503)
        return web.json_response({"ok": True})

    async def scenario() -> dict[str, int]:
        app = web.Application()
        app.router.add_post("/generate", answer)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        requests = [raw_request("127.0.0.1", port, "/generate", kind.encode(), {})
                    for kind in ("plain", "chunked", "error", "drop")]
        load = Load("127.0.0.1", port, requests, concurrency=1)  # one connection: requests go in order
        try:
            await load.start()
            while load.tally.answers < 40:
                await asyncio.sleep(0.01)
        finally:
            await load.stop()
            await runner.cleanup()
        return dict(load.tally.statuses)

    statuses = asyncio.run(scenario())
    assert set(statuses) == {"200", "503", "dropped"}, statuses
    # per cycle of four: plain and chunked (200), error (503), drop; at most one cycle is cut short
    assert abs(statuses["200"] - 2 * statuses["503"]) <= 2 and abs(statuses["503"] - statuses["dropped"]) <= 1


def test_the_load_generator_waits_its_think_time_after_each_answer_before_the_next_request() -> None:
    """With `think`, a connection asks again only that long after an answer: 0.05 s over 0.5 s allows 11 at most."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def scenario() -> tuple[int, int]:
        app = web.Application()
        app.router.add_post("/generate", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        waits: list[float] = []

        def think() -> float:
            waits.append(0.05)
            return 0.05

        load = Load("127.0.0.1", port, [raw_request("127.0.0.1", port, "/generate", b"{}", {})], 1, think)
        try:
            await load.start()
            await asyncio.sleep(0.5)
        finally:
            await load.stop()
            await runner.cleanup()
        return load.tally.answers, len(waits)

    answers, waits = asyncio.run(scenario())
    assert 1 <= answers <= 11, answers
    assert waits == answers  # one wait after every answer


@pytest.mark.slow
def test_spaced_requests_quick_measures_each_server_back_to_back_and_spaced_out(tmp_path: Path) -> None:
    result, stdout = _bench("spaced_requests", tmp_path)
    rows = {(row["mode"], row["server"]): row for row in result["rows"]}
    assert list(rows) == [(mode, server) for mode in ("back to back", "400 req/s")
                          for server in ("bare-protocol", "bare-bytes", "bench")]
    for key, row in rows.items():
        assert row["requests_per_s"] > 0 and row["server_cpu_us_per_answer"] > 0 and row["not_200"] == 0, row
    for server in ("bare-protocol", "bare-bytes", "bench"):  # the think times held the rate near the one asked
        assert rows[("400 req/s", server)]["requests_per_s"] < 600
        spaced, closed = rows[("400 req/s", server)], rows[("back to back", server)]  # the ratio is of these rows
        assert spaced["cost_over_back_to_back"] == pytest.approx(  # the rows' figures are rounded, the ratio is not
            spaced["server_cpu_us_per_answer"] / closed["server_cpu_us_per_answer"], rel=0.02)
    seen = result["identified"]  # the bench replayed each request, not drifted
    assert seen["requests"] > 0 and seen["identified"] == seen["requests"] and seen["drifted"] == 0, seen
    assert "think times from seed 0" in stdout and result["seed"] == 0
    assert (tmp_path / "spaced_requests.csv").read_text().count("\n") == 7


@pytest.mark.slow
def test_tokenizer_speed_quick_measures_both_backends_on_identical_output(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    result, stdout = _bench("tokenizer_speed", tmp_path)
    rows = {row["backend"]: row for row in result["rows"]}
    assert list(rows) == ["hand-bpe", "tokenizers"]
    for row in rows.values():
        assert row["encode_mb_per_s"] > 0 and row["decode_mtok_per_s"] > 0 and row["synth_cpu_s"] > 0, row
        assert row["chat_render_us"] > 0 and row["chat_encode_us"] > 0 and row["chat_route_cached_us"] > 0, row
    assert rows["hand-bpe"]["tokens"] == rows["tokenizers"]["tokens"] > 0  # the same ids, counted
    assert result["parameters"]["chat_prompts"] > result["distinct_chat_prompts"] > 0  # the cache has repeats
    assert set(result["faster"].values()) <= {"hand-bpe", "tokenizers"}
    assert "identical ids, texts and synth bytes" in stdout


@pytest.mark.slow
def test_sweep_executors_quick_runs_the_same_sweep_locally_and_on_a_two_node_cluster(tmp_path: Path) -> None:
    """Quick mode: one round of each executor over the same 2 runs, the same figures from both (the benchmark
    asserts it), CPU and wall per run for both, and the 1,000-run table labelled as extrapolated."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'rollout-bench[ray]')")
    result, stdout = _bench("sweep_executors", tmp_path)
    assert [r["kind"] for r in result["rounds"]] in (["local", "ray"], ["ray", "local"])
    for kind in ("local", "ray"):
        assert result["per_run"][kind]["cpu_s"] > 0 and result["per_run"][kind]["run_wall_s"] > 0
    assert result["cpu_ratio"] == pytest.approx(result["per_run"]["ray"]["cpu_s"] / result["per_run"]["local"]["cpu_s"])
    assert len(result["extrapolated_1000_runs"]) == 9 and "EXTRAPOLATED" in stdout


@pytest.mark.slow
def test_handler_instructions_drives_each_server_through_its_protocol_and_counts_every_answer() -> None:
    """The in-memory harness answers exactly the requests asked for, the bench's all 200, bench-plan's plan firing
    (some answers not 200, or dropped and replaced); without valgrind it still reports the CPU per request."""
    results = {}
    for kind in ("bare-bytes", "bench", "bench-plan"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.handler_instructions", kind, "--warm-up", "200",
                               "--measured", "600"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-4000:]
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, result in results.items():
        answered = sum(n for status, n in result["statuses"].items() if status != "dropped")
        assert result["answers"] == answered == 800, (kind, result)
        assert result["cpu_us_per_request"] > 0
    assert results["bare-bytes"]["statuses"] == results["bench"]["statuses"] == {"200": 800}
    assert set(results["bench-plan"]["statuses"]) - {"200"}, results["bench-plan"]  # the chaos plan fired
