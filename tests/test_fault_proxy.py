"""The fault engine in front of a LIVE engine (`rollout-bench proxy`, `run --upstream`).

The upstream here is the bench's own mock serving rlvr-500 with NO fault plan: everything faulty the client
sees was done by the proxy in front of it. Each live-applicable fault fires under a plan, is in the proxy's
fault log with its identity, and shows to a plain aiohttp client; the same plan and seed fire the same events
at any concurrency; a fault that cannot act on live replies is refused by name; and a whole `run --upstream`
finds seed-000's crash exactly where the mock run finds it, and nothing on the fixed variant.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from array import array
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from bench.orchestration.runner import RunConfig, run_blocking
from bench.replay.store import RecordedTrajectory
from bench.server import ServerThread
from bench.server.proxy import load_upstream_context
from faults import PlanError, plan_from_specs, resolve_plan
from faults.hooks import POISON_MARKER
from faults.live import LIVE, REFUSED, check_live_plan, unclassified

EOS = 1758
NO_WORKERS = (b'{"error":{"type":"Service Unavailable","code":"no_available_workers","message":'
              b'"No available workers (all circuits open or unhealthy)"}}')


@pytest.fixture
def upstream() -> Iterator[ServerThread]:
    """A fresh, fault-free mock engine per test (its request identification starts over too)."""
    with ServerThread("rlvr-500") as thread:
        yield thread


@contextmanager
def proxy(upstream: ServerThread, *specs: str, seed: int = 0, **options: Any) -> Iterator[ServerThread]:
    """The proxy in front of `upstream`, carrying a plan of `specs` (every rule always fires unless scheduled)."""
    plan = plan_from_specs(list(specs), seed) if specs else None
    context = load_upstream_context(upstream.url, trace="rlvr-500", plan=plan, **options)
    with ServerThread(context=context) as thread:
        yield thread


def prompt(thread: ServerThread, group: int = 0) -> tuple[RecordedTrajectory, list[int]]:
    trajectory = thread.context.store.trajectories[group * 4]
    return trajectory, list(array("i", trajectory.sequences[0][: trajectory.prompt_len * 4]))


@dataclass
class Seen:
    """What a plain aiohttp client got: status, headers, parsed body or stream events, or the error it raised."""

    status: int | None = None
    headers: dict[str, str] | None = None
    body: Any = None
    events: list[Any] | None = None
    raw: bytes = b""
    error: BaseException | None = None
    elapsed: float = 0.0


def call(url: str, path: str, body: dict[str, Any], *, timeout: float = 30) -> Seen:
    async def go() -> Seen:
        seen = Seen()
        started = time.monotonic()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                async with http.post(url + path, json=body) as reply:
                    seen.status, seen.headers = reply.status, dict(reply.headers)
                    seen.raw = await reply.read()
                    if body.get("stream"):
                        seen.events = [json.loads(line[6:]) for line in seen.raw.decode().split("\n\n")
                                       if line.startswith("data: {")]
                    else:
                        seen.body = json.loads(seen.raw)
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as error:
            seen.error = error
        seen.elapsed = time.monotonic() - started
        return seen

    return asyncio.run(go())


def generate(url: str, ids: list[int], *, stream: bool = False, timeout: float = 30) -> Seen:
    return call(url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2048, "temperature": 1.0},
                                   "return_logprob": True, "stream": stream}, timeout=timeout)


def one_event(thread: ServerThread, fault: str) -> dict[str, Any]:
    events = thread.context.faults.log.as_dicts()
    assert [e["fault"] for e in events] == [fault], events
    return events[0]


def recorded(trajectory: RecordedTrajectory) -> tuple[list[int], list[float]]:
    turn = trajectory.turns[0]
    return list(turn.output_ids), list(turn.logprobs or [])


# -- each live-applicable fault: fired, logged with its identity, seen by the client ---------------------------------
def test_missing_logprobs(upstream: ServerThread) -> None:
    with proxy(upstream, "missing_logprobs") as front:
        trajectory, ids = prompt(front)
        seen = generate(front.url, ids)
        assert seen.status == 200 and "output_token_logprobs" not in seen.body["meta_info"]
        assert seen.body["output_ids"] == recorded(trajectory)[0]  # the engine's tokens, its logprobs gone
        event = one_event(front, "missing_logprobs")
        assert (event["trajectory"], event["group"], event["turn"], event["attempt"]) == (trajectory.id, "g00000", 0, 1)
        assert seen.headers["X-Bench-Served-Trajectory"] == trajectory.id
        assert event["request_id"] == seen.body["meta_info"]["id"]
    direct = generate(upstream.url, ids)  # the engine itself sends them: the proxy dropped them
    assert len(direct.body["meta_info"]["output_token_logprobs"]) == len(direct.body["output_ids"])


@contextmanager
def engine_without_logprobs() -> Iterator[ServerThread]:
    """A mock engine that answers every request without logprobs (its own `missing_logprobs`, not the proxy's)."""
    with ServerThread("rlvr-500", plan=plan_from_specs(["missing_logprobs"], 0)) as thread:
        yield thread


def test_an_engine_answer_without_logprobs_goes_out_without_them() -> None:
    """The proxy re-renders every answer: the engine's missing `output_token_logprobs` must stay missing (it came
    out as an empty list, `output_token_logprobs_length: 0`, next to all the ids), and the request log and the
    served tokens must say no logprobs were served (they said True)."""
    completion = {"model": "m", "max_tokens": 64, "logprobs": 1}
    with engine_without_logprobs() as engine, proxy(engine) as front:
        trajectory, ids = prompt(front)
        seen = generate(front.url, ids)
        direct = generate(engine.url, ids)  # the engine's own answer (to the group's next member)
        streamed = generate(front.url, ids, stream=True)
        openai_direct = call(engine.url, "/v1/completions", {**completion, "prompt": ids})
        openai_seen = call(front.url, "/v1/completions", {**completion, "prompt": ids})
        records = [r for r in front.context.log.records if r.status == 200]
        served = [front.context.served.entry_of(r) for r in records]
    assert "output_token_logprobs" not in direct.body["meta_info"]  # the engine's answer
    assert seen.status == 200 and seen.body["output_ids"] == recorded(trajectory)[0]
    assert not {"output_token_logprobs", "input_token_logprobs", "output_token_logprobs_length"} & set(
        seen.body["meta_info"]), seen.body["meta_info"].keys()
    assert streamed.events and not any("output_token_logprobs" in e["meta_info"] for e in streamed.events)
    assert openai_direct.body["choices"][0]["logprobs"] is None and openai_seen.body["choices"][0]["logprobs"] is None
    assert len(records) == 3 and [r.logprobs_served for r in records] == [False] * 3
    assert all(e is not None and not e.logprobs_shown for e in served)
    assert not front.context.faults.log.as_dicts()  # nothing of the proxy's plan did it


def test_a_streamed_text_only_answer_keeps_the_logprobs_the_engine_sent() -> None:
    """An engine streaming text without token ids (SGLang's OpenAI routes) still sends logprobs: its stream's
    assembled answer holds none one per id, which is not "the engine sent none", so they are not left out."""
    completion = {"model": "m", "max_tokens": 32, "logprobs": 1, "stream": True}
    with ServerThread("rlvr-500", plan=plan_from_specs(["text_without_ids"], 0)) as engine, proxy(engine) as front:
        _, ids = prompt(front)
        direct = call(engine.url, "/v1/completions", {**completion, "prompt": ids})
        seen = call(front.url, "/v1/completions", {**completion, "prompt": ids})

    def logprobs(events: list[dict[str, Any]]) -> list[Any]:
        return [p for e in events if e.get("choices") and e["choices"][0].get("logprobs")
                for p in e["choices"][0]["logprobs"]["token_logprobs"]]

    assert logprobs(direct.events) and all(p is not None for p in logprobs(direct.events))  # the engine sent them
    # not left out as if the engine had sent none: one entry per chunk, as before (their values are not carried
    # through a text-only stream yet: the assembled answer keeps no logprobs it cannot line up with ids)
    assert len(logprobs(seen.events)) == len(logprobs(direct.events)), seen.events[:2]


def test_a_plan_fault_still_acts_on_an_engine_answer_without_logprobs() -> None:
    """A fault of the proxy's own plan that writes logprob entries (here one null) still shows them."""
    with engine_without_logprobs() as engine, proxy(engine, "null_logprob") as front:
        _, ids = prompt(front)
        seen = generate(front.url, ids)
        record = next(r for r in front.context.log.records if r.status == 200)
    entries = seen.body["meta_info"]["output_token_logprobs"]
    assert len(entries) == len(seen.body["output_ids"]) and None in [e[0] for e in entries]
    assert record.logprobs_served is True
    one_event(front, "null_logprob")


def test_unfaulted_answers_are_the_engines(upstream: ServerThread) -> None:
    with proxy(upstream) as front:
        trajectory, ids = prompt(front, 3)
        seen = generate(front.url, ids)
        streamed = generate(front.url, ids, stream=True)
    output, logprobs = recorded(trajectory)
    assert seen.status == 200 and seen.body["output_ids"] == output
    assert [t[0] for t in seen.body["meta_info"]["output_token_logprobs"]] == pytest.approx(logprobs)
    assert seen.body["meta_info"]["finish_reason"] == trajectory.turns[0].finish_reason
    assert streamed.events[-1]["output_ids"] == recorded(front.context.store.trajectories[13])[0]  # member 1
    assert not front.context.faults.log.as_dicts()


def test_router_no_workers(upstream: ServerThread) -> None:
    with proxy(upstream, "router_no_workers") as front:
        trajectory, ids = prompt(front)
        seen = call(front.url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}})
        assert seen.status == 503 and seen.raw == NO_WORKERS
        assert seen.headers["x-smg-error-code"] == "no_available_workers"
        event = one_event(front, "router_no_workers")
        assert (event["trajectory"], event["attempt"]) == (trajectory.id, 1)
        assert not [r for r in upstream.context.log.records if r.endpoint == "/generate"]  # nor does a router's 503
        again = call(front.url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}})
        assert again.status == 503  # the resubmission is that turn's next attempt, and the rule fires again
        assert [(e["trajectory"], e["attempt"]) for e in front.context.faults.log.as_dicts()] == [
            (trajectory.id, 1), (trajectory.id, 2)]


@pytest.mark.parametrize("stream", [False, True])
def test_abort(upstream: ServerThread, stream: bool) -> None:
    with proxy(upstream, "abort:keep=0.5") as front:
        trajectory, ids = prompt(front)
        seen = generate(front.url, ids, stream=stream)
        final = seen.events[-1] if stream else seen.body
        output = recorded(trajectory)[0]
        assert final["meta_info"]["finish_reason"]["type"] == "abort"
        assert final["meta_info"]["completion_tokens"] == len(output) // 2
        event = one_event(front, "abort")
        assert event["change"] == f"aborted after {len(output) // 2} tokens"
        served = front.context.served
        entry = served.of_trajectory(trajectory.id)[0]
        assert list(served.tokens(entry)) == output[: len(output) // 2]  # the served-tokens log holds what was sent


def test_stale_weight_version(upstream: ServerThread) -> None:
    with proxy(upstream, "stale_weight_version:behind=2") as front:
        trajectory, ids = prompt(front)
        update = call(front.url, "/update_weight_version", {"new_version": "7"})  # forwarded to the engine
        assert update.status == 200 and upstream.context.state.weight_version == "7"
        seen = generate(front.url, ids)
        assert seen.body["meta_info"]["weight_version"] == "5"
        assert generate(upstream.url, ids).body["meta_info"]["weight_version"] == "7"  # what the engine said
        assert one_event(front, "stale_weight_version")["change"] == "weight_version 7 -> 5"


@pytest.mark.parametrize("stream", [False, True])
def test_truncated_body(upstream: ServerThread, stream: bool) -> None:
    with proxy(upstream, "truncated_body:keep=0.5") as front:
        trajectory, ids = prompt(front)
        seen = generate(front.url, ids, stream=stream)
        assert seen.status == 200 and isinstance(seen.error, aiohttp.ClientPayloadError)
        assert one_event(front, "truncated_body")["trajectory"] == trajectory.id


def test_latency_keeps_the_answer(upstream: ServerThread) -> None:
    with proxy(upstream) as plain:
        _, ids = prompt(plain)
        baseline = generate(plain.url, ids)
    with proxy(upstream, "latency:ms=1000") as front:  # wide: a loaded CI machine slows the baseline too
        seen = generate(front.url, ids)
        assert seen.elapsed >= 1.0 and seen.body["output_ids"] == recorded(front.context.store.trajectories[1])[0]
        assert one_event(front, "latency")["change"] == "delayed 1000.0 ms"
    assert seen.elapsed - baseline.elapsed >= 0.8  # the delay, whatever the machine's load adds to both


def test_stall(upstream: ServerThread) -> None:
    with proxy(upstream, "stall:seconds=5") as front:
        trajectory, ids = prompt(front)
        seen = generate(front.url, ids, timeout=0.6)
        assert isinstance(seen.error, asyncio.TimeoutError) and seen.status is None  # not a byte came
        assert one_event(front, "stall")["trajectory"] == trajectory.id


def test_connection_reset_and_http_error(upstream: ServerThread) -> None:
    with proxy(upstream, "connection_reset:turns=0,attempts=1", "http_error:status=500,attempts=2") as front:
        trajectory, ids = prompt(front)
        reset = generate(front.url, ids)
        assert isinstance(reset.error, aiohttp.ServerDisconnectedError)
        error = generate(front.url, ids)
        assert error.status == 500 and error.raw == b"Internal Server Error"
        fine = generate(front.url, ids)
        assert fine.status == 200 and fine.body["output_ids"] == recorded(trajectory)[0]
        # a fault that answers in the generation's place spares the engine: it was asked once, for the third
        assert [r.endpoint for r in upstream.context.log.records if r.endpoint == "/generate"] == ["/generate"]
        assert [(e["fault"], e["trajectory"], e["attempt"]) for e in front.context.faults.log.as_dicts()] == [
            ("connection_reset", trajectory.id, 1), ("http_error", trajectory.id, 2)]


def test_faults_that_write_text(upstream: ServerThread) -> None:
    with proxy(upstream, "raise_after_generate:groups=g00000", "oversized_tool_output:bytes=5000,groups=g00001"
               ) as front:
        _, poisoned_ids = prompt(front, 0)
        _, tool_ids = prompt(front, 1)
        poisoned = generate(front.url, poisoned_ids)
        assert POISON_MARKER in poisoned.body["text"]
        assert front.context.tokenizer.decode(poisoned.body["output_ids"], skip_special_tokens=True) == \
            poisoned.body["text"]
        tool = generate(front.url, tool_ids)
        assert "<tool_call>" in tool.body["text"] and "head -c 5000" in tool.body["text"]
        assert sorted(e["fault"] for e in front.context.faults.log.as_dicts()) == [
            "oversized_tool_output", "raise_after_generate"]


def test_openai_routes(upstream: ServerThread) -> None:
    with proxy(upstream, "text_without_ids:trajectories=g00000-0", "nan_logprob:groups=g00001") as front:
        trajectory, ids = prompt(front, 0)
        seen = call(front.url, "/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 64, "logprobs": 1})
        assert seen.status == 200 and "token_ids" not in seen.body["choices"][0]
        assert seen.body["choices"][0]["text"] == front.context.tokenizer.decode(
            recorded(trajectory)[0][:64], skip_special_tokens=True)
        _, other = prompt(front, 1)
        nan = call(front.url, "/v1/completions", {"model": "m", "prompt": other, "max_tokens": 64, "logprobs": 1})
        assert b"NaN" in nan.raw
        chat = call(front.url, "/v1/chat/completions", {"model": "m", "messages": trajectory.prompt_messages,
                                                         "max_tokens": 16, "logprobs": True})
        assert chat.status == 200 and chat.body["choices"][0]["message"]["role"] == "assistant"
        streamed = call(front.url, "/v1/chat/completions", {"model": "m", "messages": trajectory.prompt_messages,
                                                             "max_tokens": 16, "stream": True})
        assert streamed.events[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in streamed.events).strip()
        assert sorted(e["fault"] for e in front.context.faults.log.as_dicts()) == ["nan_logprob", "text_without_ids"]


def test_admin_routes_are_the_engines(upstream: ServerThread) -> None:
    with proxy(upstream) as front:
        for path in ("/get_model_info", "/get_server_info", "/v1/models", "/health"):
            async def both(path: str = path) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
                async with aiohttp.ClientSession() as http:
                    async with http.get(front.url + path) as a, http.get(upstream.url + path) as b:
                        return (a.status, await a.read()), (b.status, await b.read())

            (status, body), (direct_status, _) = asyncio.run(both())
            assert status == direct_status == 200
            if path in ("/get_model_info",):
                assert json.loads(body)["model_path"] == "rollout-bench/synthetic"
        flushed = call(front.url, "/flush_cache", {})
        assert flushed.error is not None or flushed.status == 200  # plain text, forwarded
        endpoints = [r.endpoint for r in upstream.context.log.records]
        assert "/flush_cache" in endpoints and "/get_server_info" in endpoints  # it reached the engine


# -- determinism ---------------------------------------------------------------------------------------------------
CHURN = ("missing_logprobs:p=0.3", "abort:p=0.2", "http_error:status=503,p=0.15", "stale_weight_version:p=0.2",
         "latency:ms=20,p=0.2")


def _run(upstream: str, concurrency: int, target: str = "ref-gather:fixed", **options: Any) -> Any:
    return run_blocking(RunConfig(trace="rlvr-500", plan=plan_from_specs(list(CHURN), 11), target=target, n=40,
                                  concurrency=concurrency, upstream=upstream, isolation="inline", **options))


def test_same_plan_same_events_at_any_concurrency(upstream: ServerThread) -> None:
    serial = _run(upstream.url, 1)
    parallel = _run(upstream.url, 32)
    identities = sorted((e.rule, e.fault, e.trajectory, e.turn, e.attempt) for e in serial.fault_events)
    assert len(identities) >= 20 and {e.fault for e in serial.fault_events} == {
        "missing_logprobs", "abort", "http_error", "stale_weight_version", "latency"}
    assert identities == sorted((e.rule, e.fault, e.trajectory, e.turn, e.attempt) for e in parallel.fault_events)
    # and they are the mock's own decisions for those trajectories (same seed, same ids)
    mock = run_blocking(RunConfig(trace="rlvr-500", plan=plan_from_specs(list(CHURN), 11), target="ref-gather:fixed",
                                  n=40, concurrency=8, isolation="inline"))
    assert identities == sorted((e.rule, e.fault, e.trajectory, e.turn, e.attempt) for e in mock.fault_events)


# -- refusals ------------------------------------------------------------------------------------------------------
def test_every_fault_is_classified_for_live_engines() -> None:
    assert unclassified() == []
    assert {name for name, (kind, _) in LIVE.items() if kind == REFUSED} == {"abort_all_on_weight_update", "hold_weights"}


def test_unapplicable_faults_are_refused_by_name(upstream: ServerThread) -> None:
    with pytest.raises(PlanError, match=r"rule 'abort_all_on_weight_update#0': fault 'abort_all_on_weight_update' "
                                        r"cannot apply to a live engine's replies: it aborts the generations"):
        load_upstream_context(upstream.url, plan=plan_from_specs(["abort_all_on_weight_update"], 0))
    stale_retry = plan_from_specs(["stale_retry"], 0)
    with pytest.raises(PlanError, match="fault 'stale_retry' cannot apply .* applied by the bench's target adapter"):
        check_live_plan(stale_retry, tokenizer=True, adapter=False)  # a bare proxy: nobody applies it
    check_live_plan(stale_retry, tokenizer=True, adapter=True)  # run --upstream: the adapter does
    with pytest.raises(PlanError, match="fault 'oversized_tool_output' .* needs the model's tokenizer"):
        check_live_plan(plan_from_specs(["oversized_tool_output"], 0), tokenizer=False, adapter=False)
    cli = subprocess.run([sys.executable, "-m", "bench", "proxy", "--upstream", upstream.url, "--port", "0",
                          "--fault", "abort_all_on_weight_update"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "fault 'abort_all_on_weight_update' cannot apply" in cli.stderr


def test_the_proxy_command(upstream: ServerThread, tmp_path: Path) -> None:
    """`rollout-bench proxy` as a user runs it: prints its URL, faults live answers per plan, logs, stops on SIGTERM."""
    process = subprocess.Popen([sys.executable, "-m", "bench", "proxy", "--upstream", upstream.url, "--port", "0",
                                "--trace", "rlvr-500", "--fault", "missing_logprobs:turns=0", "--seed", "3",
                                "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"proxy at (http://127\.0\.0\.1:\d+) in front of " + re.escape(upstream.url), line)
        assert match, line + process.stderr.read()  # type: ignore[union-attr]
        plan_line = process.stdout.readline().strip()  # type: ignore[union-attr]
        assert plan_line == "fault plan 'command-line': 1 rules, seed 3"
        _, ids = prompt(upstream)
        seen = generate(match.group(1), ids)
        assert seen.status == 200 and "output_token_logprobs" not in seen.body["meta_info"] and seen.body["output_ids"]
        assert seen.headers["X-Bench-Served-Trajectory"] == "g00000-0"  # named by the trace's ids
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "stopped after 1 requests, 1 fault events" in out
    faults = (tmp_path / "faults.csv").read_text().splitlines()
    assert len(faults) == 2 and ",missing_logprobs,g00000-0,g00000,0,1,/generate," in faults[1]


def test_an_unreachable_upstream_is_named() -> None:
    cli = subprocess.run([sys.executable, "-m", "bench", "proxy", "--upstream", "http://127.0.0.1:9", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "upstream http://127.0.0.1:9 does not answer" in cli.stderr, cli.stderr


# -- a whole run against the live engine ---------------------------------------------------------------------------
def _cli_run(tmp: Path, name: str, *extra: str, reruns: int = 0) -> tuple[int, dict[str, Any], str]:
    out = tmp / name
    done = subprocess.run([sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "40", "--plan",
                           "seed-000", "--seed", "0", "--repro-reruns", str(reruns), "--out", str(out), "--junit",
                           str(out / "junit-copy.xml"), *extra], capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return done.returncode, summary, done.stdout + done.stderr


def _findings(summary: dict[str, Any]) -> list[tuple[str, str | None]]:
    return sorted((v["invariant"], v["trajectory"]) for v in summary["violations"])


def test_run_upstream_against_an_engine_without_logprobs_is_not_green(tmp_path: Path) -> None:
    """`run --upstream` in front of an engine that omits logprobs: the target gets the answer the engine gave, so
    token_alignment names every completed trajectory, as in mock mode (it was green: 0 response ids recorded for
    each completed sample, read from the proxy's empty logprob list, and provenance checked nothing)."""
    def run(name: str, *extra: str) -> tuple[int, dict[str, Any], str]:
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "bench", "run", "--trace", "rlvr-500", "--n", "8", "--target",
                               "ref-gather:fixed", "--plan", "none", "--repro-reruns", "0", "--out", str(out), *extra],
                              capture_output=True, text=True, timeout=300)
        return done.returncode, json.loads((out / "summary.json").read_text()), done.stdout + done.stderr

    with engine_without_logprobs() as engine:
        code, live, output = run("live", "--upstream", engine.url)
    mock_code, mock, _ = run("mock", "--fault", "missing_logprobs:p=1")
    assert code == mock_code == 1, output
    assert _findings(live) == _findings(mock) == sorted(("token_alignment", f"g0000{g}-{m}") for g in (0, 1)
                                                        for m in range(4))
    assert {v["message"] for v in live["violations"]} == {"completed sample without logprobs"}
    assert live["provenance"]["mismatch"] == 0 and live["provenance"]["match"] == 8  # the ids are the engine's


def test_run_upstream_finds_the_seed_000_crash(upstream: ServerThread, tmp_path: Path) -> None:
    mock_code, mock, _ = _cli_run(tmp_path, "mock", "--target", "ref-gather:unfixed")
    code, live, output = _cli_run(tmp_path, "live", "--target", "ref-gather:unfixed", "--upstream", upstream.url,
                                  reruns=4)
    assert mock_code == code == 1, output
    assert _findings(live) == _findings(mock) == [("batch_survival", "g00005-0")]
    assert live["batch_error"]["type"] == "InjectedFault" and live["batch_error"]["raised_by"] == "g00005-0"
    assert live["fidelity"] == {"applies": False, "why": f"the answers came from the live engine at {upstream.url}, "
                                "not from the recording: there is nothing to compare the requests with"}
    assert re.search(r"replay fidelity +does not apply", output)
    junit = (tmp_path / "live" / "junit-copy.xml").read_text()
    assert '<testcase classname="rollout_bench.ref-gather:unfixed" name="replay_fidelity">\n    <skipped' in junit
    assert "does not apply: the answers came from the live engine" in junit
    assert mock["fidelity"]["unfaithful"] is False  # the mock run does judge it
    repro = tmp_path / "live" / "repro.toml"  # verified against the live engine too: one trajectory, one event
    assert f'upstream = "{upstream.url}"' in repro.read_text() and 'trajectories = ["g00005-0"]' in repro.read_text()
    rerun = subprocess.run([sys.executable, "-m", "bench", "run", "--repro", str(repro), "--target", "ref-gather:fixed",
                            "--repro-reruns", "0", "--out", str(tmp_path / "rerun")], capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0 and re.search(r"replay fidelity +does not apply", rerun.stdout), rerun.stdout
    fixed_code, fixed, output = _cli_run(tmp_path, "fixed", "--target", "ref-gather:fixed", "--upstream", upstream.url)
    assert fixed_code == 0 and fixed["violations"] == [], output
    assert fixed["outcomes"]["aborted"] == 1 and fixed["provenance"]["mismatch"] == 0


def test_a_named_trajectory_is_placed_by_its_name_at_any_order() -> None:
    """The tracker's hint: a failed member's identical sibling is a new member when it names itself, not a retry."""
    from bench.capture.tracker import KnownGroup, TrafficTracker, ids_key

    prompt_key = ids_key([5, 6, 7])
    tracker = TrafficTracker({prompt_key: KnownGroup("g", ("g-0", "g-1"), (0, 1))})
    second = tracker.place(prompt_key, "g-1")  # arrives first, named: it is g-1, not the first member
    assert (second.trajectory, second.attempt, second.kind) == ("g-1", 0, "new")
    tracker.settle(second, b"", "error")
    first = tracker.place(prompt_key, "g-0")  # unnamed, this would be g-1's retry
    assert (first.trajectory, first.attempt, first.kind) == ("g-0", 0, "new")
    again = tracker.place(prompt_key, "g-1")
    assert (again.trajectory, again.attempt, again.kind) == ("g-1", 1, "retry")
    assert tracker.place(prompt_key, "nobody").trajectory == "g-2"  # a name that fits nothing is ignored


def test_a_local_tokenizer_writes_answers_as_the_bench_tokenizer_does(tmp_path: Path) -> None:
    """`--tokenizer DIR` (a live model's folder, read by transformers): what the proxy's formatters call of it agrees
    with the bench's own tokenizer on the bench's folder, copied so it is taken for a model's."""
    import shutil

    from bench.capture.upstream import LocalTokenizer
    from bench.tokenizer import load_tokenizer, tokenizer_path

    pytest.importorskip("transformers", reason="--tokenizer DIR reads the folder with transformers")
    folder = shutil.copytree(tokenizer_path(), tmp_path / "model-tokenizer")
    local, bench = LocalTokenizer(str(folder)), load_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "naïve café: 2+2?"}]
    assert local.apply_chat_template(messages, add_generation_prompt=True) == bench.apply_chat_template(
        messages, add_generation_prompt=True)
    ids = bench.encode(bench.apply_chat_template(messages, add_generation_prompt=True) + "4, of course.")
    assert local.encode(local.decode(ids)) == ids and local.decode(ids, skip_special_tokens=True) == bench.decode(
        ids, skip_special_tokens=True)
    assert [local.is_special(i) for i in ids] == [bench.is_special(i) for i in ids]
    assert local.is_special(local.eos_token_id) and local.eos_token_id == bench.eos_token_id
    assert b"".join(local.token_bytes(i) for i in bench.encode("plain ascii text")) == b"plain ascii text"


def test_multi_turn_tool_loop_through_the_proxy() -> None:
    """Turns placed from the tokens alone (each extends the last input and output), tool calls and all: seed-004's
    multi-turn desyncs show through the proxy as on the mock, and the fixed tool loop is green."""
    plan = resolve_plan("seed-004")
    with ServerThread("agentic-500") as engine:
        unfixed = run_blocking(RunConfig(trace="agentic-500", plan=plan, target="ref-tool-loop:unfixed", n=40,
                                         upstream=engine.url, isolation="inline"))
    with ServerThread("agentic-500") as engine:
        fixed = run_blocking(RunConfig(trace="agentic-500", plan=plan, target="ref-tool-loop:fixed", n=40,
                                       upstream=engine.url, isolation="inline"))
    mock = run_blocking(RunConfig(trace="agentic-500", plan=plan, target="ref-tool-loop:unfixed", n=40,
                                  isolation="inline"))
    found = {v.invariant for v in unfixed.violations}
    assert found == {v.invariant for v in mock.violations} == {"token_alignment", "provenance", "context_budget"}
    assert max(r.turn or 0 for r in unfixed.requests) >= 5  # many turns, each placed in its trajectory
    assert {e.fault for e in unfixed.fault_events} >= {"abort", "missing_logprobs", "oversized_tool_output"}
    assert fixed.violations == [] and {e.fault for e in fixed.fault_events} >= {"abort", "oversized_tool_output"}


# -- every live-applicable fault, generically: it fires once, on the right attempt, and the client sees a change ---
HOW_SEEN = {  # fault spec -> (route kind, how the client sees it)
    "abort": ("native", "body"), "connection_reset": ("native", "error"), "context_length_error": ("native", "400"),
    "empty_completion": ("native", "body"), "http_error": ("native", "500"), "latency:ms=1000": ("native", "time"),
    "logprob_length_mismatch": ("native", "body"), "malformed_json": ("native", "body"),
    "missing_logprobs": ("native", "body"), "missing_weight_version": ("native", "body"),
    "nan_logprob": ("native", "body"), "null_logprob": ("native", "body"), "outage": ("native", "503"),
    "oversized_tool_output": ("native", "body"), "raise_after_generate": ("native", "body"),
    "router_no_workers": ("native", "503"), "slow_first_token:seconds=1": ("stream", "time"),
    "stale_weight_version": ("native", "body"), "stall:seconds=1": ("native", "time"),
    "stream_cut:after=1,clean=true": ("stream", "body"), "stream_no_finish_reason": ("stream", "body"),
    "text_without_ids": ("openai", "body"), "truncated_body": ("native", "error"),
    "wrong_content_type": ("native", "content type"), "zero_length": ("native", "body"),
}
VOLATILE = (rb'"(id|e2e_latency|response_sent_to_client_ts|created)":("[^"]*"|[0-9.e+-]+)', rb"")


def _exchange(url: str, kind: str, ids: list[int], member: str) -> tuple[int | None, dict[str, str], bytes, str, float]:
    """(status, headers, body with volatile fields blanked, error type, seconds) of one request naming `member`."""
    path, body = ("/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 2048, "logprobs": 1}) \
        if kind == "openai" else ("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2048},
                                                "return_logprob": True, "stream": kind == "stream"})

    async def go() -> tuple[int | None, dict[str, str], bytes, str, float]:
        started, status, headers, raw, error = time.monotonic(), None, {}, b"", ""
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(url + path, json=body, headers={"X-Bench-Trajectory": member}) as reply:
                    status, headers = reply.status, dict(reply.headers)
                    raw = await reply.read()
        except aiohttp.ClientError as failure:
            error = type(failure).__name__
        return status, headers, re.sub(VOLATILE[0], VOLATILE[1], raw), error, time.monotonic() - started

    return asyncio.run(go())


def test_every_live_fault_is_covered_here() -> None:
    applicable = {name for name, (kind, _) in LIVE.items() if kind not in (REFUSED, "client side")}
    assert {spec.split(":")[0] for spec in HOW_SEEN} == applicable


@pytest.mark.parametrize("spec", sorted(HOW_SEEN))
def test_every_live_fault_fires_once_and_shows(upstream: ServerThread, spec: str) -> None:
    kind, seen_as = HOW_SEEN[spec]
    with proxy(upstream, f"{spec}{',' if ':' in spec else ':'}attempts=2") as front:
        trajectory, ids = prompt(front, 2)
        clean = _exchange(front.url, kind, ids, trajectory.id)  # attempt 1: the engine's answer, as it is
        faulted = _exchange(front.url, kind, ids, trajectory.id)  # attempt 2: the plan's
        events = front.context.faults.log.as_dicts()
    assert [(e["fault"], e["trajectory"], e["turn"], e["attempt"]) for e in events] == [
        (spec.split(":")[0], trajectory.id, 0, 2)]
    assert clean[0] == 200 and not clean[3]
    if seen_as == "body":
        assert faulted[0] == 200 and faulted[2] != clean[2]
    elif seen_as == "error":
        assert faulted[3] in ("ServerDisconnectedError", "ClientPayloadError")
    elif seen_as == "time":
        # the same answer, a second later than the clean one: compared with it, not with an absolute bound (a loaded
        # CI machine slows the clean answer too: it saw 0.47 s)
        assert faulted[4] >= 1.0 and faulted[4] - clean[4] >= 0.8 and faulted[2] == clean[2]
    elif seen_as == "content type":
        assert faulted[1]["Content-Type"] == "application/octet-stream" and faulted[2] == clean[2]
    else:
        assert faulted[0] == int(seen_as)


def test_the_engines_own_errors_pass_through_unfaulted(upstream: ServerThread) -> None:
    """An engine error (here its context-length 400) comes back byte for byte, the plan does not touch it, and the
    attempt counts as failed: the resubmission is the turn's next attempt."""
    too_long = {"max_new_tokens": 10**6}
    with proxy(upstream, "missing_logprobs") as front:
        trajectory, ids = prompt(front)
        body = {"input_ids": ids, "sampling_params": too_long, "return_logprob": True}
        direct = call(upstream.url, "/generate", body)
        seen = call(front.url, "/generate", body)
        again = call(front.url, "/generate", body)
        records = [r for r in front.context.log.records if r.endpoint == "/generate"]
        events = front.context.faults.log.as_dicts()
    assert direct.status == seen.status == again.status == 400 and seen.raw == direct.raw
    assert b"maximum context length" in seen.raw
    assert [(r.trajectory, r.attempt, r.status, r.error) for r in records] == [
        (trajectory.id, 1, 400, "upstream answered 400"), (trajectory.id, 2, 400, "upstream answered 400")]
    assert events == []  # nothing the plan did shows on the engine's own error


def test_a_proxy_without_a_trace_names_the_traffic_itself(upstream: ServerThread) -> None:
    """No dataset: trajectories get ids made from the traffic (a digest of the group's prompt and the member's
    order), the same in every run, and schedules decide on those."""
    seen_ids = []
    for _ in range(2):
        context = load_upstream_context(upstream.url, plan=plan_from_specs(["missing_logprobs:turns=0"], 0))
        with ServerThread(context=context) as front:
            _, ids = prompt(upstream)
            first, second = generate(front.url, ids), generate(front.url, ids)
            assert "output_token_logprobs" not in first.body["meta_info"]
            seen_ids.append([first.headers["X-Bench-Served-Trajectory"], second.headers["X-Bench-Served-Trajectory"]])
            assert [(e["trajectory"], e["turn"]) for e in front.context.faults.log.as_dicts()] == [
                (seen_ids[-1][0], 0), (seen_ids[-1][1], 0)]
    group = seen_ids[0][0].rsplit("-", 1)[0]
    assert seen_ids[0] == seen_ids[1] == [f"{group}-0", f"{group}-1"] and group.startswith("g")
