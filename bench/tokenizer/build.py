"""Builds the shipped tokenizer folder: a deterministic BPE trained on generated text.

Run `python -m bench.tokenizer.build [FOLDER]` to regenerate `assets/`; a test checks that
the committed files are exactly what this produces. Training uses only the standard
library and a fixed seed, so the vocabulary never depends on an installed package's data.
"""

from __future__ import annotations

import heapq
import json
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from .bpe import SPLIT_PATTERN
from .bytelevel import BYTE_TO_CHAR, to_symbols

from . import TOKENIZER_NAME as NAME
MERGES = 1500
MODEL_MAX_LENGTH = 32768
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

_WORDS = """
the of and to in is that it for on with as was be by this are from or at an have not
which but all can has one will their more if about when there so what up out into
them some than its other time only new could these two may first then do any like my
now over such our man even most made after also did many before must through back
years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both
life being under never day same another know while last might us great old year off
come since against go came right used take three number answer value total step sum
find let compute result therefore thus solve equation apples books coins price cost
each per more less twice half times minus plus divided equals remaining left has had
file line error test tests function class method return import from def self none
true false print assert raise except try pass yield async await lambda value key list
dict string int float bool path module package repository issue bug fix patch diff
run running failed passed output input read write open close config setup build
install version python pytest src lib main utils core api server client request
response status code message data json http tool call arguments command search view
edit replace create directory found missing expected actual traceback warning info
""".split()

_CODE_LINES = [
    "def {a}_{b}(self, {c}):", "    return self.{a}({c})", "import {a}", "from {a}.{b} import {c}",
    "class {A}{B}:", "    {a} = {c}.get('{b}')", "if {a} is None:", "    raise ValueError('{a} {b}')",
    "for {a} in {b}s:", "assert {a} == {n}", "{a}/{b}/{c}.py:{n}: in {a}_{b}", "E   AssertionError: {n} != {m}",
    "FAILED tests/test_{a}.py::test_{b} - {A}Error", "===== {n} passed, {m} failed in {n}.{m}s =====",
]


def build_corpus(seed: int = 0, sentences: int = 6000) -> str:
    """Generated English-like prose, math, code and tool-call text to learn merges from."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(sentences):
        kind = rng.random()
        if kind < 0.5:
            words = rng.choices(_WORDS, k=rng.randint(4, 16))
            out.append(" ".join(words).capitalize() + rng.choice([".", ".", "?", ",", ":"]))
        elif kind < 0.7:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"We have {a} + {b} = {a + b}, so the answer is \\boxed{{{a + b}}}.")
        elif kind < 0.9:
            fmt = rng.choice(_CODE_LINES)
            a, b, c = rng.sample(_WORDS, 3)
            out.append(fmt.format(a=a, b=b, c=c, A=a.capitalize(), B=b.capitalize(),
                                  n=rng.randint(0, 99), m=rng.randint(0, 99)))
        else:
            cmd = " ".join(rng.choices(_WORDS, k=3))
            out.append('{"name": "bash", "arguments": {"command": "grep -rn ' + cmd + ' src/"}}')
        out.append("\n" if rng.random() < 0.3 else " ")
    return "".join(out)


def train_merges(text: str, merges: int) -> list[tuple[str, str]]:
    """Learn `merges` BPE merges; ties broken by the pair's text so training is deterministic."""
    words = Counter(to_symbols(w) for w in re.findall(SPLIT_PATTERN, text))
    symbols = [list(w) for w in words]
    counts = list(words.values())
    pair_count: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for index, word in enumerate(symbols):
        for pair in zip(word, word[1:]):
            pair_count[pair] += counts[index]
            where[pair].add(index)
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    learned: list[tuple[str, str]] = []
    while heap and len(learned) < merges:
        negative, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negative or -negative <= 0:
            continue
        learned.append(pair)
        merged = pair[0] + pair[1]
        changed: set[tuple[str, str]] = set()
        for index in sorted(where.pop(pair, ())):
            word, weight = symbols[index], counts[index]
            for old in zip(word, word[1:]):
                pair_count[old] -= weight
                changed.add(old)
            new_word, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
                    new_word.append(merged)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            symbols[index] = new_word
            for new in zip(new_word, new_word[1:]):
                pair_count[new] += weight
                where[new].add(index)
                changed.add(new)
        pair_count.pop(pair, None)
        for candidate in changed:
            n = pair_count.get(candidate, 0)
            if n > 0 and candidate != pair:
                heapq.heappush(heap, (-n, candidate))
    return learned


def _load_chat_template() -> str:
    return (Path(__file__).with_name("chat_template.jinja")).read_text(encoding="utf-8")


def tokenizer_files(merges: int = MERGES) -> dict[str, str]:
    """The contents of every file of the tokenizer folder, by file name."""
    learned = train_merges(build_corpus(), merges)
    vocab = {char: i for i, char in enumerate(BYTE_TO_CHAR)}
    for left, right in learned:
        vocab.setdefault(left + right, len(vocab))
    added = []
    for content in SPECIAL_TOKENS + TAG_TOKENS:
        added.append({"id": len(vocab) + len(added), "content": content, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False,
                      "special": content in SPECIAL_TOKENS})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in learned]},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "name_or_path": NAME,
        "model_max_length": MODEL_MAX_LENGTH,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
        "chat_template": _load_chat_template(),
    }
    special_map = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}

    def dump(obj: object) -> str:
        return json.dumps(obj, ensure_ascii=False, indent=1) + "\n"

    return {"tokenizer.json": dump(spec), "tokenizer_config.json": dump(config),
            "special_tokens_map.json": dump(special_map)}


def write_tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in tokenizer_files().items():
        (folder / name).write_text(content, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else Path(__file__).with_name("assets")
    write_tokenizer(folder)
    print(f"wrote tokenizer to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
