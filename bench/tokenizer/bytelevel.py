"""The byte <-> printable-character table of byte-level BPE.

Byte-level BPE works on text whose every byte has been replaced by one printable
unicode character, so any string (any language, any emoji) is representable with a
256-symbol base alphabet and decodes back byte for byte. Printable Latin-1 bytes map to
themselves; the rest are shifted past U+0100, as in the GPT-2 family, which is what
`tokenizers`' ByteLevel pre-tokenizer and decoder expect.
"""

from __future__ import annotations


def _build_byte_to_char() -> list[str]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    table: dict[int, int] = {b: b for b in printable}
    shift = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = 256 + shift
            shift += 1
    return [chr(table[byte]) for byte in range(256)]


BYTE_TO_CHAR: list[str] = _build_byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}


def to_symbols(text: str) -> str:
    """Map `text`'s UTF-8 bytes to their byte-level characters."""
    return "".join(BYTE_TO_CHAR[b] for b in text.encode("utf-8"))


def from_symbols(symbols: str) -> bytes:
    """Inverse of `to_symbols`, on the concatenation of token strings."""
    return bytes(CHAR_TO_BYTE[c] for c in symbols)
