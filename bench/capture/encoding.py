"""Compressed answers, read: the recorder forwards an upstream's bytes as they are (gzip or deflate when the
client accepts it) and parses a decompressed copy."""

from __future__ import annotations

import zlib

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded(raw: bytes, encoding: str) -> tuple[bytes, str | None]:
    """(the body decompressed, None), or (b"", why it cannot be read) for an encoding the recorder does not read."""
    if encoding in ("", "identity"):
        return raw, None
    if encoding not in _WBITS:
        return b"", f"the answer is {encoding}-encoded, which the recorder cannot read (forwarded as it was)"
    try:
        return zlib.decompress(raw, _WBITS[encoding]), None
    except zlib.error:
        try:  # "deflate" is sometimes raw deflate, without the zlib header
            return zlib.decompress(raw, -zlib.MAX_WBITS), None
        except zlib.error as error:
            return b"", f"the {encoding} answer does not decompress ({error})"


class StreamDecoder:
    """A stream's chunks decompressed as they pass; an encoding it cannot read gives nothing (noted by the stream's
    assembler as a stream that ended without an answer)."""

    def __init__(self, encoding: str) -> None:
        self._decompress = (None if encoding in ("", "identity") else
                            zlib.decompressobj(_WBITS[encoding]) if encoding in _WBITS else False)

    def feed(self, chunk: bytes) -> bytes:
        if self._decompress is None:
            return chunk
        if self._decompress is False:
            return b""
        try:
            return self._decompress.decompress(chunk)
        except zlib.error:
            self._decompress = False
            return b""
