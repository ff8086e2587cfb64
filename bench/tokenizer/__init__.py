"""The bench's shipped tokenizer: byte-level BPE, loadable with or without transformers.

Real rollout code loads its tokenizer with `AutoTokenizer.from_pretrained(folder)`; the
bench points it at `tokenizer_path()`, a folder inside the installed package, so nothing
is ever downloaded.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .bpe import AddedToken, ByteBPETokenizer
TOKENIZER_NAME = "rollout-bench/byte-bpe-v1"


def tokenizer_path() -> Path:
    """Folder holding `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`."""
    return Path(__file__).with_name("assets")


@lru_cache(maxsize=1)
def load_tokenizer() -> ByteBPETokenizer:
    """The shipped tokenizer (cached: it is immutable)."""
    return ByteBPETokenizer.from_folder(tokenizer_path())


__all__ = ["AddedToken", "ByteBPETokenizer", "TOKENIZER_NAME", "load_tokenizer", "tokenizer_path"]
