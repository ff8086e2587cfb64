"""A local Hugging Face tokenizer folder, behind the few methods the server's formatters and faults call.

Only the proxy uses it (`rollout-bench proxy --tokenizer DIR`): a live engine's model has its own vocabulary,
and the texts the bench writes into its answers (partial answers, logprob triples, a fault's tool call) must
be in it. `transformers` is imported only here, only when a folder is given; nothing is downloaded
(`local_files_only`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence


class HFTokenizer:
    """`transformers.AutoTokenizer` from a folder, with the bench tokenizer's interface."""

    def __init__(self, folder: str | Path) -> None:
        path = Path(folder)
        if not (path / "tokenizer_config.json").exists() and not (path / "tokenizer.json").exists():
            raise ValueError(f"--tokenizer {folder}: not a tokenizer folder (no tokenizer.json or "
                             "tokenizer_config.json in it)")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError(f"--tokenizer {folder}: loading a tokenizer folder needs the transformers package "
                             "(pip install transformers)") from None
        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = str(path)
        if self._tok.eos_token_id is None:
            raise ValueError(f"--tokenizer {folder}: the tokenizer names no EOS token")
        self.eos_token_id: int = int(self._tok.eos_token_id)
        self._special = frozenset(int(i) for i in self._tok.all_special_ids)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_bytes(self, token_id: int) -> bytes:
        """A token's text as bytes (a piece of a multi-byte character decodes to U+FFFD, as SGLang shows it)."""
        return self.decode([token_id]).encode("utf-8")

    def apply_chat_template(self, messages: Sequence[dict[str, Any]], *,
                            tools: Sequence[dict[str, Any]] | None = None, add_generation_prompt: bool = False) -> str:
        return str(self._tok.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                                 add_generation_prompt=add_generation_prompt, tokenize=False))
