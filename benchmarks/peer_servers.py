"""`python -m benchmarks.peer_servers`: the bench's chat route beside the mock LLM servers a user would pick instead.

Issue 18 asks how the bench compares with the mock servers people reach for: fakellm, mockllm and llmock,
each installed from the package index in its own virtualenv under `.bench/` (`make bench-peers`; nothing
is downloaded here). Every server answers the same OpenAI-style chat requests on `/v1/chat/completions`:
each trajectory's turn-0 messages from the trace, with `logprobs` and `return_token_ids` as an RL stack
asks, named in `X-Bench-Trajectory` as the reference targets do (the peers ignore the header):

  bare-bytes      bare aiohttp answering the bench's own reply as precomputed bytes: the ceiling
  bench-chat      the bench server replaying the trace, no fault plan
  fakellm, ...    each peer started as its command line does (access log on, its defaults), configured to
                  answer one fixed text: the bench's reply of median size
  fakellm-quiet   the same app under uvicorn with no access log (and no reloader: mockllm's command line
                  always starts one)

The bench answers with the recorded token ids and per-token logprobs; the peers answer the text alone,
so their replies are far smaller (the table gives every reply's size). Why many trajectories and not one
request over and over: the bench's cost per answer grows with the attempts it has logged for one
trajectory's turn (a retry storm, not a rollout); a rollout asks each turn about once.

Servers run one at a time under load, all pinned to one core, the load generator (`http_load`, C
keep-alive connections) on another; rounds are interleaved with a rotating order, medians and the rounds'
spread reported, and the load generator's CPU share beside each window's (near 1.0 with the server's
below 1.0: the client limited).
A peer whose environment is missing or that cannot start gets a row saying why.

The model name sent is the one the bench reports, which no OpenAI tokenizer maps: mockllm counts tokens
with tiktoken, which fetches an OpenAI model's encoding from the network on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import (
    add_pinning_arguments,
    add_window_arguments,
    check_window_arguments,
    interleaved,
    median,
    print_table,
    start_pinned,
    process_tree,
    process_tree_cpu_s,
    spread,
    write_results,
)
from .http_load import measure_rounds, raw_request
from .server_throughput import ServerProcess, check_identified
from .throughput_servers import TRAJECTORY_HEADER

HOST = "127.0.0.1"
CHAT = "/v1/chat/completions"
MODEL = "rollout-bench/synthetic"  # what the bench answers as its model; no tiktoken encoding maps it
DEFAULT_PEERS_DIR = Path(".bench")
NOT_BUILT = "not built: make bench-peers"
WHAT = {"bare-bytes": "bare aiohttp, the bench's reply as precomputed bytes (ceiling)",
        "bench-chat": "bench server, replay, no plan: token ids and logprobs"}
VOLATILE = ("id", "created")  # fields a reply may change per request; everything else must repeat byte for byte
_VOLATILE_PATTERNS = (re.compile(rb'"id":\s*"[^"]*"'), re.compile(rb'"created":\s*\d+'))


@dataclass(frozen=True)
class Peer:
    """How to configure and start one peer: `configure` writes its files into a folder and returns the
    environment its app reads them from; `command` is its own command line (default mode)."""

    name: str
    app: str  # uvicorn import string (quiet mode)
    factory: bool
    configure: Callable[[Path, str], dict[str, str]]
    command: Callable[[Path, int, Path], list[str]]
    defaults: str  # what its command line turns on that quiet mode does not
    after_start: Callable[[int, str], None] | None = None
    quirks: str = ""  # per-request work of its own, in both modes (read in its installed source)


def _yaml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid double-quoted YAML scalar


def _fakellm_config(folder: Path, text: str) -> dict[str, str]:
    path = folder / "fakellm.yaml"
    path.write_text(f"version: 1\nrules:\n  - name: fixed\n    respond:\n      content: {_yaml_string(text)}\n")
    return {"FAKELLM_CONFIG": str(path)}


def _mockllm_config(folder: Path, text: str) -> dict[str, str]:
    path = folder / "responses.yml"
    path.write_text(f"responses: {{}}\ndefaults:\n  unknown_response: {_yaml_string(text)}\n")
    return {"MOCKLLM_RESPONSES_FILE": str(path)}


def _llmock_config(folder: Path, text: str) -> dict[str, str]:
    return {"LLMOCK_RESPONSE_STYLE": "static"}  # the text itself is a scripted reply, queued once it listens


def _llmock_script_reply(port: int, text: str) -> None:
    """llmock answers a fixed text only as a scripted reply: queue one that never runs out (`times: null`)."""
    body = json.dumps({"behaviors": [{"type": "reply", "text": text, "times": None}]}).encode()
    request = urllib.request.Request(f"http://{HOST}:{port}/_llmock/scenario", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        if reply.status != 201:
            raise RuntimeError(f"llmock refused the scripted reply: HTTP {reply.status}")


PEERS = {
    "fakellm": Peer(
        "fakellm", "fakellm.server:app", False, _fakellm_config,
        lambda bin_, port, folder: [str(bin_ / "fakellm"), "serve", "--host", HOST, "--port", str(port),
                                    "--config", str(folder / "fakellm.yaml")],
        "uvicorn's access log (info level)"),
    "mockllm": Peer(
        "mockllm", "mockllm.server:app", False, _mockllm_config,
        lambda bin_, port, folder: [str(bin_ / "mockllm"), "start", "--responses", str(folder / "responses.yml"),
                                    "--host", HOST, "--port", str(port)],
        "uvicorn's access log; its --reload flag defaults to on and cannot be turned off: a reloader process "
        "watches the folder and the app runs in a child",
        quirks="it re-reads and re-parses its responses YAML on every request (its modification-time check compares "
               "a float with an int), logging a line each time, in both modes"),
    "llmock": Peer(
        "llmock", "llmock.main:create_app", True, _llmock_config,
        lambda bin_, port, folder: [str(bin_ / "llmock"), "serve", "--host", HOST, "--port", str(port),
                                    "--response-style", "static"],
        "uvicorn's access log (info level)", _llmock_script_reply),
}

# Quiet mode: the same app under uvicorn with its automatic choices (uvloop and httptools when installed),
# no access log, no reloader.
_QUIET = ("import sys, uvicorn; app, factory, host, port = sys.argv[1:]; "
          "uvicorn.run(app, factory=factory == '1', host=host, port=int(port), access_log=False, log_level='warning')")
_INFO = ("import json, importlib.metadata as m, importlib.util as u, sys; "
         "v = lambda n: m.version(n) if u.find_spec(n.replace('-', '_')) else None; "
         "print(json.dumps({'version': m.version(sys.argv[1]), 'uvicorn': v('uvicorn'), 'fastapi': v('fastapi'), "
         "'uvloop': v('uvloop'), 'httptools': v('httptools'), 'python': sys.version.split()[0]}))")


def chat_requests(trace: str, limit: int | None) -> list[tuple[str, bytes]]:
    """(trajectory id, body) of each trajectory's turn 0 as an RL stack sends it to an OpenAI-style server."""
    from bench.replay import TraceStore
    from bench.trace.shipped import resolve_trace

    requests = []
    for trajectory in TraceStore.load(resolve_trace(trace)).trajectories[:limit]:
        if not trajectory.prompt_messages:
            raise SystemExit(f"{trajectory.id} of {trace} has no chat messages to send: use a chat trace")
        sampling = trajectory.first_sampling_params
        body = {"model": MODEL, "messages": trajectory.prompt_messages, "logprobs": True, "return_token_ids": True,
                "max_completion_tokens": sampling.get("max_new_tokens", 1024),
                "temperature": sampling.get("temperature", 1.0), "top_p": sampling.get("top_p", 1.0)}
        requests.append((trajectory.id, json.dumps(body, separators=(",", ":")).encode()))
    if not requests:
        raise SystemExit(f"{trace} has no trajectories")
    return requests


def exchange(port: int, raw: bytes, timeout: float = 30.0) -> tuple[int, bytes, bytes]:
    """Send the load generator's exact request bytes once: (status, header bytes, body bytes)."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"port {port} closed the connection before a whole header")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "content-length" not in headers:
            raise ValueError(f"port {port} answered without Content-Length: {lines[0]}")
        need = int(headers["content-length"])
        while len(body) < need:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"port {port} closed the connection mid-body ({len(body)} of {need} bytes)")
            body += chunk
        return int(lines[0].split()[1]), head + b"\r\n\r\n", body[:need]


def masked(body: bytes) -> bytes:
    """The body with the first `id` and `created` values blanked: what must repeat across requests."""
    for pattern in _VOLATILE_PATTERNS:
        body = pattern.sub(lambda m: m.group(0).split(b":", 1)[0] + b":_", body, count=1)
    return body


def check_replies(port: int, raws: list[bytes], repeats: int, text: str | None) -> dict[str, Any]:
    """Send each request `repeats` times: statuses, sizes, whether each request's answers are equal byte for
    byte but for `VOLATILE`, and (for a peer) whether it answered the configured text."""
    answers = [[exchange(port, raw) for _ in range(repeats)] for raw in raws]
    flat = [answer for same in answers for answer in same]
    contents = []
    for _, _, body in flat:
        try:
            contents.append(json.loads(body)["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            contents.append(None)
    masked_per_request = [len({masked(body) for _, _, body in same}) for same in answers]
    result = {"requests": len(raws), "repeats": repeats, "statuses": sorted({status for status, _, _ in flat}),
              "body_bytes": median([len(body) for _, _, body in flat]),
              "head_bytes": median([len(head) for _, head, _ in flat]), "volatile": list(VOLATILE),
              "distinct_masked_bodies_per_request": masked_per_request,
              "distinct_bodies_per_request": [len({body for _, _, body in same}) for same in answers],
              "equal_modulo_volatile": all(n == 1 for n in masked_per_request)}
    if text is not None:
        result["answers_configured_text"] = all(c == text for c in contents)
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class PeerProcess:
    """One peer, started from its virtualenv in a folder of its own, pinned to `core` (its children inherit
    the pinning); its CPU is the whole process tree's. Stopped by SIGTERM to its pid, then any child left."""

    def __init__(self, peer: Peer, mode: str, venv: Path, folder: Path, text: str, core: int | None) -> None:
        self.peer, self.mode, self.text = peer, mode, text
        self.kind = peer.name if mode == "default" else f"{peer.name}-quiet"
        folder.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(peer.configure(folder, text))
        self.port = free_port()
        if mode == "default":
            command = peer.command(venv / "bin", self.port, folder)
        else:
            command = [str(venv / "bin" / "python"), "-c", _QUIET, peer.app, "1" if peer.factory else "0", HOST,
                       str(self.port)]
        self.log_path = folder / "server.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            preexec_fn=_pinner(core))
        self.pid, self.core = self.process.pid, core

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with status {self.process.returncode} before listening: {self.log_tail()}")
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not listening after {timeout_s:g} s: {self.log_tail()}") from None
                time.sleep(0.2)
        if self.peer.after_start is not None:
            self.peer.after_start(self.port, self.text)

    def cpu_s(self) -> float:
        return process_tree_cpu_s(self.pid)

    def log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or "(no output)"

    def log_lines(self) -> int:
        return len(self.log_path.read_bytes().splitlines())

    def stop(self) -> None:
        family = process_tree(self.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in family[1:]:  # a reloader's child outliving it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _pinner(core: int | None) -> Callable[[], None] | None:
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {core})


def peer_info(venv: Path, name: str) -> dict[str, Any]:
    """The installed versions in a peer's virtualenv: the peer, uvicorn, fastapi, uvloop, httptools."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", _INFO, name], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{venv}/bin/python cannot read its versions: {last[-300:]}")
    return json.loads(done.stdout)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_servers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_window_arguments(parser, "all servers")
    parser.add_argument("--trace", default="rlvr-500", help="trace whose chat request is sent (rlvr-500)")
    parser.add_argument("--requests", type=int, help="use only the first N trajectories (default all)")
    parser.add_argument("--checks", type=int, default=3,
                        help="times each of the first 3 requests is sent to each server to check its replies (3)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"peers to run ({','.join(PEERS)}; '' for none)")
    parser.add_argument("--modes", default="default,quiet", help="default (as their command line starts them), "
                        "quiet (no access log, no reloader), or both (default,quiet)")
    parser.add_argument("--peers-dir", type=Path, default=DEFAULT_PEERS_DIR,
                        help=f"where `make bench-peers` built one virtualenv per peer ({DEFAULT_PEERS_DIR})")
    add_pinning_arguments(parser)
    args = parser.parse_args(argv)
    check_window_arguments(parser, args)
    if args.checks < 2:
        parser.error("--checks must be >= 2")
    args.peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or set(args.modes) - {"default", "quiet"}:
        parser.error("--modes: a comma-separated list of default and quiet")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info, server_core, client_core, parameters = start_pinned(args)
    requests = chat_requests(args.trace, args.requests)
    raws = [raw_request(HOST, 0, CHAT, body, {TRAJECTORY_HEADER: trajectory}) for trajectory, body in requests]
    sample = raws[:3]  # what each server's replies are checked on
    servers: dict[str, Any] = {}
    unavailable: dict[str, str] = {}  # kind -> why it has no measurement
    peers: dict[str, dict[str, Any]] = {}
    checks: dict[str, dict[str, Any]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="rb-peers-"))
    try:
        servers["bench-chat"] = ServerProcess("bench", server_core, ["--trace", args.trace])
        servers["bench-chat"].wait_ready()
        checks["bench-chat"] = check_replies(servers["bench-chat"].port, sample, args.checks, None)
        replies: dict[str, tuple[int, bytes]] = {}
        for (trajectory, _), raw in zip(requests, raws):
            status, _, reply = exchange(servers["bench-chat"].port, raw)
            if status != 200:
                raise SystemExit(f"the bench answered {trajectory}'s turn 0 with HTTP {status}: {reply[:300]!r}")
            replies[trajectory] = (status, reply)
        by_size = sorted(replies.items(), key=lambda item: len(item[1][1]))
        fixed_trajectory, (_, fixed_reply) = by_size[len(by_size) // 2]
        answer = json.loads(fixed_reply)
        text = answer["choices"][0]["message"]["content"]
        bench_body_bytes = median([len(reply) for _, reply in replies.values()])
        bodies = scratch / "bodies.json"
        bodies.write_text(json.dumps({t: [status, json.loads(reply)] for t, (status, reply) in replies.items()}))
        servers["bare-bytes"] = ServerProcess("bare-bytes", server_core, ["--bodies", str(bodies), "--route", CHAT])
        servers["bare-bytes"].wait_ready()
        checks["bare-bytes"] = check_replies(servers["bare-bytes"].port, sample, args.checks, None)
        bare_body_bytes = median([len(exchange(servers["bare-bytes"].port, raw)[2]) for raw in raws])
        for name in args.peers:
            venv = args.peers_dir / name
            kinds = [name if mode == "default" else f"{name}-quiet" for mode in args.modes]
            if not (venv / ".built").exists():
                peers[name] = {"status": NOT_BUILT, "venv": str(venv)}
                unavailable.update({kind: NOT_BUILT for kind in kinds})
                continue
            try:
                peers[name] = {"status": "built", "venv": str(venv), **peer_info(venv, name),
                               "defaults": PEERS[name].defaults, "quirks": PEERS[name].quirks}
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as error:
                peers[name] = {"status": f"broken environment: {error}", "venv": str(venv)}
                unavailable.update({kind: peers[name]["status"] for kind in kinds})
                continue
            for mode, kind in zip(args.modes, kinds):
                try:
                    peer = PeerProcess(PEERS[name], mode, venv.resolve(), scratch / kind, text, server_core)
                except OSError as error:  # its command is missing from the environment
                    unavailable[kind] = f"could not start: {error}"
                    continue
                servers[kind] = peer
                try:
                    peer.wait_ready()
                    checks[kind] = check_replies(peer.port, sample, args.checks, text)
                except (RuntimeError, OSError, ValueError) as error:
                    unavailable[kind] = f"could not start: {error}"
                    peer.stop()
                    del servers[kind]
                    continue
                if checks[kind]["statuses"] != [200] or not checks[kind]["answers_configured_text"]:
                    unavailable[kind] = (f"answered HTTP {checks[kind]['statuses']} without the configured text: "
                                         "not measured")
                    peer.stop()
                    del servers[kind]
        measured = [kind for kind in ("bare-bytes", "bench-chat", *_peer_kinds(args)) if kind in servers]
        print(f"servers on core {server_core}, load generator on core {client_core}; {len(requests)} chat requests "
              f"(turn 0 of {args.trace}'s trajectories), bench replies of {bench_body_bytes:.0f} bytes (median); the "
              f"peers answer {fixed_trajectory}'s text; measuring {', '.join(measured)}"
              + (f"; not measured: {', '.join(f'{k} ({v})' for k, v in unavailable.items())}" if unavailable else ""))
        windows = measure_rounds(HOST, {kind: (servers[kind].port, _cpu_of(servers[kind])) for kind in measured},
                                 measured, raws, args, interleaved)
        identified = check_identified(servers["bench-chat"], CHAT)
        log_lines = {kind: s.log_lines() for kind, s in servers.items() if isinstance(s, PeerProcess)}
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    rows = _rows(args, windows, checks, unavailable, log_lines)
    for row in rows:  # the ceiling and the bench answer every request differently: their median over all of them
        if row["server"] in ("bare-bytes", "bench-chat"):
            row["reply_body_bytes"] = bare_body_bytes if row["server"] == "bare-bytes" else bench_body_bytes
    logprob_bytes = len(json.dumps(answer["choices"][0]["logprobs"], separators=(",", ":")))
    tokens = len(answer["choices"][0].get("token_ids") or [])
    print()
    print_table(["server", "req/s", "ratio", "vs bench", "spread", "server CPU", "CPU us/answer", "cost ratio",
                 "loadgen CPU", "reply bytes", "log lines", "note"],
                [[r["server"], r["requests_per_s"], r["ratio_to_bare_bytes"], r["ratio_to_bench_chat"],
                  r["spread"], r["server_cpu_share"], r["server_cpu_us_per_answer"], r["cost_ratio_to_bare_bytes"],
                  r["loadgen_cpu_share"], r["reply_body_bytes"], r["access_log_lines"], r["note"]]
                 for r in rows])
    print(f"\nratio: req/s over bare-bytes' (median of {args.rounds} round(s) of {args.seconds:g} s); vs bench: over "
          "bench-chat's; spread: (max - min) / median of the rounds; cost ratio: bare-bytes' server CPU per answer "
          "over this server's; loadgen CPU: the load generator's share of its core (near 1.0 with a server below "
          "1.0: the client, not the server, set the rate)")
    print(f"bench-chat answers with the recorded token ids and their logprobs (for {fixed_trajectory}: {tokens} "
          f"tokens, logprobs {logprob_bytes} of its {len(fixed_reply)} body bytes); the peers answer that reply's "
          f"text ({len(text)} characters) with neither")
    for name, peer in peers.items():
        if peer["status"] == "built":
            print(f"{name} {peer['version']}: uvicorn {peer['uvicorn']}, uvloop {peer['uvloop'] or 'no'}, "
                  f"httptools {peer['httptools'] or 'no (h11)'}; its command line adds: {peer['defaults']}"
                  + (f"; {PEERS[name].quirks}" if PEERS[name].quirks else ""))
        else:
            print(f"{name}: {peer['status']}")
    bench_check = checks["bench-chat"]
    print(f"bench-chat: {bench_check['requests']} requests sent {bench_check['repeats']} times each, answers "
          f"{'equal' if bench_check['equal_modulo_volatile'] else 'NOT equal'} byte for byte but for "
          f"{', '.join(VOLATILE)}; {identified['identified']} of {identified['requests']} requests identified as "
          f"their trajectory's turn 0, {identified['drifted']} drifted")
    payload = {"benchmark": "peer_servers", "machine": info, "load_average_1m": os.getloadavg()[0],
               "parameters": parameters, "requests": len(requests),
               "request_bytes_median": median([len(body) for _, body in requests]),
               "bench_reply_bytes_median": bench_body_bytes, "fixed_reply_trajectory": fixed_trajectory,
               "fixed_reply_bytes": len(fixed_reply), "reply_text_chars": len(text), "bench_token_ids": tokens,
               "bench_logprob_bytes": logprob_bytes,
               "rows": rows, "peers": peers, "checks": checks, "identified": identified, "windows": windows,
               "unavailable": unavailable}
    json_path, csv_path = write_results(args.out, "peer_servers", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0 if bench_check["equal_modulo_volatile"] and identified["identified"] == identified["requests"] else 1


def _cpu_of(server: Any) -> Any:
    """A server's CPU seconds: a peer's own accounting (its reloader and worker), else its process tree's."""
    return server.cpu_s if isinstance(server, PeerProcess) else (lambda: process_tree_cpu_s(server.pid))


def _peer_kinds(args: argparse.Namespace) -> list[str]:
    return [name if mode == "default" else f"{name}-quiet" for name in args.peers for mode in args.modes]


def _what(kind: str) -> str:
    if kind in WHAT:
        return WHAT[kind]
    name, quiet = kind.removesuffix("-quiet"), kind.endswith("-quiet")
    return f"{name}, uvicorn without access log or reloader" if quiet else f"{name}, as its command line starts it"


def _rows(args: argparse.Namespace, windows: dict[str, list[dict[str, Any]]], checks: dict[str, dict[str, Any]],
          unavailable: dict[str, str], log_lines: dict[str, int]) -> list[dict[str, Any]]:
    def rate(kind: str) -> float:
        return median([w["requests_per_s"] for w in windows[kind]])

    base_rate, bench_rate = rate("bare-bytes"), rate("bench-chat")
    base_cost = median([w["server_cpu_us_per_answer"] for w in windows["bare-bytes"]])
    rows = []
    for kind in ("bare-bytes", "bench-chat", *_peer_kinds(args)):
        row: dict[str, Any] = {"server": kind, "what": _what(kind), "requests_per_s": None, "ratio_to_bare_bytes": None,
                               "ratio_to_bench_chat": None, "spread": None, "server_cpu_share": None,
                               "server_cpu_us_per_answer": None, "cost_ratio_to_bare_bytes": None,
                               "loadgen_cpu_share": None, "not_200": None, "reply_body_bytes": None,
                               "reply_head_bytes": None, "access_log_lines": log_lines.get(kind), "note": "",
                               "rounds_requests_per_s": []}
        if kind in checks:
            row["reply_body_bytes"] = checks[kind]["body_bytes"]
            row["reply_head_bytes"] = checks[kind]["head_bytes"]
        if kind not in windows:
            row["note"] = unavailable.get(kind, "not measured")
            rows.append(row)
            continue
        rates = [w["requests_per_s"] for w in windows[kind]]
        cost = median([w["server_cpu_us_per_answer"] for w in windows[kind]])
        statuses: Counter[str] = Counter()
        for window in windows[kind]:
            statuses.update(window["statuses"])
        row.update({"requests_per_s": round(rate(kind), 1),
                    "ratio_to_bare_bytes": round(rate(kind) / base_rate, 3) if base_rate else float("nan"),
                    "ratio_to_bench_chat": round(rate(kind) / bench_rate, 3) if bench_rate else float("nan"),
                    "spread": round(spread(rates), 3),
                    "server_cpu_share": round(median([w["server_cpu_share"] for w in windows[kind]]), 3),
                    "server_cpu_us_per_answer": round(cost, 1),
                    "cost_ratio_to_bare_bytes": round(base_cost / cost, 3) if cost else float("nan"),
                    "loadgen_cpu_share": round(median([w["client_cpu_share"] for w in windows[kind]]), 3),
                    "not_200": sum(n for status, n in statuses.items() if status != "200"),
                    "rounds_requests_per_s": [round(r, 1) for r in rates]})
        rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
