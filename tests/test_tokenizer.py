"""The shipped tokenizer: lossless, identical to `tokenizers`, loadable offline by transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.tokenizer import TOKENIZER_NAME, load_tokenizer, tokenizer_path
from bench.tokenizer.build import tokenizer_files

tok = load_tokenizer()

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 2+2?"}], None),
    ([{"role": "system", "content": "Answer in \\boxed{}."}, {"role": "user", "content": "naïve 日本 😀"}], None),
    (
        [
            {"role": "system", "content": "Fix the bug."},
            {"role": "user", "content": "tests fail"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls <dir> & pwd"}'}},
                {"id": "c1", "type": "function", "function": {"name": "view", "arguments": {"path": "a's.py"}}}]},
            {"role": "tool", "content": "a.py\nb.py"},
            {"role": "tool", "content": "print('x')"},
        ],
        [{"type": "function", "function": {"name": "bash", "description": "run <cmd> & more", "parameters": {}}}],
    ),
]


def test_shipped_files_are_what_the_builder_writes() -> None:
    for name, content in tokenizer_files().items():
        assert (tokenizer_path() / name).read_text(encoding="utf-8") == content, f"{name}: run `make tokenizer`"


def test_special_tokens() -> None:
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == tok.token_to_id("<|im_start|>")
    assert tok.encode("x<|im_end|>")[-1] == tok.eos_token_id == tok.token_to_id("<|im_end|>")
    assert tok.pad_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.is_special(tok.eos_token_id) and not tok.is_special(tok.token_to_id("<tool_call>"))
    assert tok.decode(tok.encode("a<|im_end|>"), skip_special_tokens=True) == "a"
    assert tok.decode(tok.encode("a<tool_call>"), skip_special_tokens=True) == "a<tool_call>"


def test_merges_compress_text() -> None:
    text = "We have 12 + 30 = 42, so the answer is \\boxed{42}. The function returns the value."
    assert len(tok.encode(text)) < len(text.encode()) / 2


def test_out_of_vocabulary_id_is_named() -> None:
    with pytest.raises(ValueError, match=f"token id {tok.vocab_size} is outside the vocabulary"):
        tok.decode([1, tok.vocab_size])


@given(st.text())
def test_decode_inverts_encode(text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_token_bytes_concatenate_to_the_text() -> None:
    text = "naïve café 😀 <|im_end|>"
    assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode()


def test_works_without_transformers() -> None:
    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['tokenizers'] = None\n"
        "from bench.tokenizer import load_tokenizer\n"
        "t = load_tokenizer(); ids = t.encode('hello <|im_end|>')\n"
        "print(t.decode(ids), t.apply_chat_template([{'role': 'user', 'content': 'x'}], add_generation_prompt=True))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out == "hello <|im_end|> <|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n\n"


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    """The shipped folder loaded the way real rollout code loads its tokenizer (skipped without the extra)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)


class TestTransformers:
    """The same folder through `transformers.AutoTokenizer`, offline."""

    def test_loads_offline_with_special_tokens(self, hf) -> None:  # type: ignore[no-untyped-def]
        assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == tok.eos_token_id
        assert hf.pad_token_id == tok.pad_token_id
        assert len(hf) == tok.vocab_size
        assert hf.name_or_path == str(tokenizer_path())

    @settings(max_examples=300)
    @given(text=st.text() | st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", " ", "\n", "a",
                                                         "  x", "\t1", "é", "😀", "'s", "42"])).map("".join))
    def test_encode_and_decode_match(self, hf, text: str) -> None:  # type: ignore[no-untyped-def]
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids
        assert hf.decode(ids) == text

    @given(ids=st.lists(st.integers(0, tok.vocab_size - 1), max_size=40))
    def test_decode_of_any_ids_matches(self, hf, ids: list[int]) -> None:  # type: ignore[no-untyped-def]
        assert hf.decode(ids) == tok.decode(ids)
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)

    @pytest.mark.parametrize("messages,tools", CONVERSATIONS)
    @pytest.mark.parametrize("add_generation_prompt", [False, True])
    def test_chat_template_matches(self, hf, messages, tools, add_generation_prompt) -> None:  # type: ignore[no-untyped-def]
        expected = hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                          add_generation_prompt=add_generation_prompt)
        assert tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt) == expected


def test_config_names_the_tokenizer() -> None:
    config = json.loads((tokenizer_path() / "tokenizer_config.json").read_text())
    assert config["name_or_path"] == TOKENIZER_NAME and config["eos_token"] == "<|im_end|>"


def _shipped_texts_and_ids() -> tuple[list[str], list[list[int]]]:
    """Every text of the shipped traces (prompts, outputs, tool outputs) and every recorded id sequence."""
    import gzip
    from pathlib import Path

    texts, ids = [], []
    for path in sorted((Path(__file__).resolve().parent.parent / "traces").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                if record.get("type") != "trajectory":
                    continue
                texts.append(record["prompt"]["text"])
                ids.append(record["prompt"]["ids"])
                for turn in record["turns"]:
                    texts.append(turn["response"]["text"])
                    ids.append(turn["response"]["output_ids"])
                    texts.extend(out["text"] for out in turn.get("tool_outputs") or [])
    return texts, ids


def test_same_ids_and_text_as_tokenizers_on_every_shipped_text() -> None:
    """The hand BPE is kept because it is faster (benchmarks/tokenizer_speed.py); it must stay exact."""
    tokenizers = pytest.importorskip("tokenizers")
    rust = tokenizers.Tokenizer.from_file(str(tokenizer_path() / "tokenizer.json"))
    texts, recorded = _shipped_texts_and_ids()
    assert len(texts) > 10_000 and len(recorded) > 5_000
    for text in texts:
        ids = tok.encode(text)
        assert rust.encode(text, add_special_tokens=False).ids == ids, text[:200]
        assert rust.decode(ids, skip_special_tokens=False) == tok.decode(ids) == text, text[:200]
    for ids in recorded:
        for skip in (False, True):
            assert rust.decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip), ids[:50]
