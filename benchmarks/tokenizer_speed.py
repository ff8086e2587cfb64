"""`python -m benchmarks.tokenizer_speed`: the bench's pure-Python byte-level BPE against `tokenizers`.

The bench tokenizes with its own BPE (`bench/tokenizer/bpe.py`) so it needs neither transformers nor torch.
`tokenizers` (Rust) reads the same `tokenizer.json` and is what the frameworks under test use; it should
replace the hand-written one only where it is faster. This measures both, in one process, on the texts of
the shipped traces (prompts, model outputs, tool outputs):

- encode throughput (MB of UTF-8 per CPU second), first pass (empty caches) and second pass;
- decode throughput (tokens per CPU second) of the ids just encoded;
- the chat route's per-request cost (`/v1/chat/completions` renders the chat template with Jinja, then
  encodes) on the shipped prompts in trace order, split into render and encode, and through `_render_chat`,
  which caches prompt ids by rendered text (a group's samples repeat their prompt);
- `synth` (the path that writes the shipped traces) end to end with each backend.

Both backends must agree on every id and text (the benchmark checks it, tests/test_tokenizer.py too).
CPU time of this process, median of `--rounds` interleaved rounds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from bench.server.openai_request import _prompt_ids, _render_chat
from bench.tokenizer import ByteBPETokenizer, tokenizer_path

from .common import DEFAULT_OUT, machine, median, print_table, write_results

TRACES = Path(__file__).resolve().parent.parent / "traces"


class RustBPETokenizer(ByteBPETokenizer):
    """The bench's tokenizer with `encode` and `decode` done by `tokenizers` (everything else shared)."""

    @classmethod
    def from_specs(cls, spec: dict[str, Any], config: dict[str, Any]) -> "RustBPETokenizer":
        from tokenizers import Tokenizer

        tokenizer = super().from_specs(spec, config)
        tokenizer._backend = Tokenizer.from_str(json.dumps(spec))  # type: ignore[attr-defined]
        return tokenizer  # type: ignore[return-value]

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids  # type: ignore[attr-defined]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)  # type: ignore[attr-defined]


BACKENDS: dict[str, type[ByteBPETokenizer]] = {"hand-bpe": ByteBPETokenizer, "tokenizers": RustBPETokenizer}


def trace_texts(names: list[str], limit: int | None) -> tuple[list[str], list[tuple[list[Any], list[Any] | None]]]:
    """Every text of the traces (prompt, outputs, tool outputs) and every prompt's (messages, tools)."""
    texts: list[str] = []
    chats: list[tuple[list[Any], list[Any] | None]] = []
    for name in names:
        with gzip.open(TRACES / f"{name}.jsonl.gz", "rt", encoding="utf-8") as handle:
            seen = 0
            for line in handle:
                record = json.loads(line)
                if record.get("type") != "trajectory":
                    continue
                seen += 1
                if limit is not None and seen > limit:
                    break
                texts.append(record["prompt"]["text"])
                if record["prompt"].get("messages"):
                    chats.append((record["prompt"]["messages"], record["prompt"].get("tools")))
                for turn in record["turns"]:
                    texts.append(turn["response"]["text"])
                    texts.extend(out["text"] for out in turn.get("tool_outputs") or [])
    return texts, chats


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def measure_round(texts: list[str], chats: list[tuple[list[Any], list[Any] | None]], text_bytes: int) -> dict:
    """One round: fresh tokenizers of both backends, every measurement once."""
    out: dict[str, dict[str, float]] = {}
    ids_by: dict[str, list[list[int]]] = {}
    for name, cls in BACKENDS.items():
        tok = cls.from_folder(tokenizer_path())
        first, ids = cpu(lambda: [tok.encode(t) for t in texts])
        second, _ = cpu(lambda: [tok.encode(t) for t in texts])
        tokens = sum(map(len, ids))
        dec, decoded = cpu(lambda: [tok.decode(i) for i in ids])
        if decoded != texts:
            raise AssertionError(f"{name}: decode(encode(text)) is not the text")
        ids_by[name] = ids
        rendered = [tok.apply_chat_template(m, tools=t, add_generation_prompt=True) for m, t in chats]
        render, _ = cpu(lambda: [tok.apply_chat_template(m, tools=t, add_generation_prompt=True) for m, t in chats])
        encode, _ = cpu(lambda: [tok.encode(r) for r in rendered])
        route, _ = cpu(lambda: [tok.encode(tok.apply_chat_template(m, tools=t, add_generation_prompt=True))
                                for m, t in chats])
        _prompt_ids.cache_clear()
        cached, _ = cpu(lambda: [_render_chat(m, t, tok) for m, t in chats])
        out[name] = {"encode_mb_per_s_first": text_bytes / first / 1e6, "encode_mb_per_s": text_bytes / second / 1e6,
                     "decode_mtok_per_s": tokens / dec / 1e6, "tokens": tokens,
                     "chat_render_us": render / len(chats) * 1e6, "chat_encode_us": encode / len(chats) * 1e6,
                     "chat_route_us": route / len(chats) * 1e6, "chat_route_cached_us": cached / len(chats) * 1e6}
    if ids_by["hand-bpe"] != ids_by["tokenizers"]:
        raise AssertionError("the two backends disagree on some ids")
    return out


def measure_synth(backend: str, kind: str, n: int) -> float:
    """CPU seconds of `synth` writing `n` trajectories of `kind` with `backend`'s tokenizer."""
    import bench.synth as synth

    original = synth.load_tokenizer
    synth.load_tokenizer = lambda: BACKENDS[backend].from_folder(tokenizer_path())  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            seconds, _ = cpu(lambda: synth.synthesize(kind, n=n, seed=1, out=Path(tmp) / "t.jsonl.gz"))
            data = (Path(tmp) / "t.jsonl.gz").read_bytes()
    finally:
        synth.load_tokenizer = original  # type: ignore[assignment]
    measure_synth.outputs[backend] = data  # type: ignore[attr-defined]
    return seconds


measure_synth.outputs = {}  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tokenizer_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="+", default=["agentic-500", "rlvr-500", "retool-64"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--synth-n", type=int, default=100, help="agentic trajectories for the synth row (100)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder ({DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 trajectories a trace, 1 round")
    args = parser.parse_args(argv)
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        parser.error("needs the `tokenizers` package (in the test venv: make .venv/.installed-test)")
    limit = 20 if args.quick else None
    if args.quick:
        args.rounds, args.synth_n = 1, 8
    info = machine()
    print(f"machine: {info['cores']} cores, {info['cpu']}, Python {info['python']}, {info['date']}")
    texts, chats = trace_texts(args.traces, limit)
    text_bytes = sum(len(t.encode()) for t in texts)
    print(f"{len(texts)} texts, {text_bytes / 1e6:.1f} MB; {len(chats)} chat prompts")
    rounds = [measure_round(texts, chats, text_bytes) for _ in range(args.rounds)]
    synth_s: dict[str, list[float]] = {name: [] for name in BACKENDS}
    for _ in range(args.rounds):
        for name in BACKENDS:
            synth_s[name].append(measure_synth(name, "agentic", args.synth_n))
    if measure_synth.outputs["hand-bpe"] != measure_synth.outputs["tokenizers"]:  # type: ignore[attr-defined]
        raise AssertionError("synth wrote different bytes with the two backends")
    rows = []
    for name in BACKENDS:
        row: dict[str, Any] = {"backend": name}
        for key in rounds[0][name]:
            row[key] = round(median([r[name][key] for r in rounds]), 3)
        row["synth_cpu_s"] = round(median(synth_s[name]), 3)
        rows.append(row)
    print_table(["backend", "encode MB/s 1st", "encode MB/s", "decode Mtok/s", "chat render µs", "chat encode µs",
                 "chat route µs", "cached µs", f"synth {args.synth_n} CPU s"],
                [[r["backend"], r["encode_mb_per_s_first"], r["encode_mb_per_s"], r["decode_mtok_per_s"],
                  r["chat_render_us"], r["chat_encode_us"], r["chat_route_us"], r["chat_route_cached_us"],
                  r["synth_cpu_s"]] for r in rows])
    hand, rust = rows
    faster = {key: "hand-bpe" if (hand[key] > rust[key] if key.endswith("_per_s") else hand[key] < rust[key])
              else "tokenizers" for key in ("encode_mb_per_s", "decode_mtok_per_s", "chat_route_us", "synth_cpu_s")}
    print(f"\nfaster: {faster}; identical ids, texts and synth bytes")
    distinct = len({json.dumps(chat) for chat in chats})
    print(f"chat route with prompt ids cached by rendered text ({distinct} distinct of {len(chats)} prompts, in "
          f"trace order): {hand['chat_route_cached_us']:.0f} µs a request against {hand['chat_route_us']:.0f} µs")
    payload = {"benchmark": "tokenizer_speed", "machine": info,
               "parameters": {"traces": args.traces, "rounds": args.rounds, "quick": args.quick,
                              "synth_n": args.synth_n, "texts": len(texts), "text_bytes": text_bytes,
                              "chat_prompts": len(chats)},
               "rows": rows, "faster": faster, "distinct_chat_prompts": distinct}
    json_path, csv_path = write_results(args.out, "tokenizer_speed", payload, rows)
    print(f"wrote {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
