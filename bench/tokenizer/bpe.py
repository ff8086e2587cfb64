"""Pure-Python byte-level BPE that encodes and decodes exactly as `tokenizers` does.

The bench needs token ids on its hot paths (synthesizing traces, answering text and chat
requests, counting prompt tokens) without importing transformers, so the shipped
`tokenizer.json` is read here directly. The file is also a valid Hugging Face tokenizer
file, so real rollout code loads the same vocabulary with `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from .bytelevel import CHAR_TO_BYTE, to_symbols

# Pre-tokenization: words with their leading space, single digits, punctuation runs with
# their leading space, whitespace runs (leaving one space to lead the next word). Only
# ASCII classes are named so Python's `re` and the Oniguruma engine of `tokenizers` agree
# on every input.
SPLIT_PATTERN = r" ?[A-Za-z]+|[0-9]| ?[^ \t\n\rA-Za-z0-9]+|[ \t\n\r]+(?![^ \t\n\r])|[ \t\n\r]+"


@dataclass(frozen=True)
class AddedToken:
    """A token matched verbatim before BPE (chat markers, tool-call tags)."""

    id: int
    content: str
    special: bool


class ByteBPETokenizer:
    """Byte-level BPE tokenizer over a `tokenizer.json` written in the Hugging Face format."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        added_tokens: Sequence[AddedToken],
        *,
        eos_token: str,
        pad_token: str,
        chat_template: str | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self._vocab = dict(vocab)
        self._ranks = {pair: rank for rank, pair in enumerate(merges)}
        self._added = {token.content: token for token in added_tokens}
        self._id_to_piece: dict[int, str] = {i: piece for piece, i in self._vocab.items()}
        self._id_to_piece.update({t.id: t.content for t in added_tokens})
        self._added_ids = frozenset(t.id for t in added_tokens)
        self._id_to_bytes = {i: self._piece_bytes(i, p) for i, p in self._id_to_piece.items()}
        self._special_ids = frozenset(t.id for t in added_tokens if t.special)
        by_length = sorted(self._added, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, by_length))) if by_length else None
        self._split_re = re.compile(SPLIT_PATTERN)
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.eos_token_id = self.token_to_id(eos_token)
        self.pad_token_id = self.token_to_id(pad_token)
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        self._encode_word = lru_cache(maxsize=65536)(self._encode_word_uncached)

    # -- loading -----------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> "ByteBPETokenizer":
        """Load `tokenizer.json` and `tokenizer_config.json` from a tokenizer folder."""
        folder = Path(folder)
        spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        return cls.from_specs(spec, config)

    @classmethod
    def from_specs(cls, spec: dict[str, Any], config: dict[str, Any]) -> "ByteBPETokenizer":
        model = spec["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"tokenizer model type {model.get('type')!r} is not BPE")
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        added = [AddedToken(t["id"], t["content"], bool(t["special"])) for t in spec["added_tokens"]]
        return cls(
            model["vocab"],
            merges,  # type: ignore[arg-type]
            added,
            eos_token=config["eos_token"],
            pad_token=config["pad_token"],
            chat_template=config.get("chat_template"),
            model_max_length=config.get("model_max_length"),
        )

    # -- vocabulary --------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._id_to_piece)

    def token_to_id(self, token: str) -> int:
        if token in self._added:
            return self._added[token].id
        return self._vocab[token]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (what OpenAI logprob `bytes` lists)."""
        return self._id_to_bytes[token_id]

    def _piece_bytes(self, token_id: int, piece: str) -> bytes:
        if token_id in self._added_ids:
            return piece.encode("utf-8")
        return bytes(CHAR_TO_BYTE[c] for c in piece)

    # -- encoding ----------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added tokens (e.g. `<|im_end|>`) are recognised verbatim."""
        ids: list[int] = []
        for segment, added in self._split_added(text):
            if added is not None:
                ids.append(added.id)
                continue
            for word in self._split_re.findall(segment):
                ids.extend(self._encode_word(to_symbols(word)))
        return ids

    def _split_added(self, text: str) -> Iterable[tuple[str, AddedToken | None]]:
        if self._added_re is None:
            yield text, None
            return
        position = 0
        for match in self._added_re.finditer(text):
            if match.start() > position:
                yield text[position : match.start()], None
            yield match.group(), self._added[match.group()]
            position = match.end()
        if position < len(text):
            yield text[position:], None

    def _encode_word_uncached(self, symbols: str) -> tuple[int, ...]:
        parts = list(symbols)
        ranks = self._ranks
        while len(parts) > 1:
            best_rank, best_at = None, -1
            for i in range(len(parts) - 1):
                rank = ranks.get((parts[i], parts[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, i
            if best_rank is None:
                break
            left, right = parts[best_at], parts[best_at + 1]
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == left and parts[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return tuple(self._vocab[p] for p in parts)

    # -- decoding ----------------------------------------------------------------
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        chunks = []
        for token_id in ids:
            if skip_special_tokens and token_id in self._special_ids:
                continue
            try:
                chunks.append(self._id_to_bytes[token_id])
            except KeyError:
                raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})") from None
        return b"".join(chunks).decode("utf-8", errors="replace")

    # -- chat --------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """Render `messages` with the shipped chat template, exactly as transformers does."""
        from .chat import render_chat

        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        return render_chat(self.chat_template, messages, tools=tools, add_generation_prompt=add_generation_prompt)


__all__ = ["AddedToken", "ByteBPETokenizer", "SPLIT_PATTERN"]
