"""The served tokens of a report folder (`served_tokens.npz`), for notebooks: what request `seq` was served."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SERVED_FILE = "served_tokens.npz"


@dataclass(frozen=True)
class ServedArrays:
    """Per request (`seq`, the row of the `requests` table): where its tokens sit in `ids` and `logprobs`.

    Logprobs are NaN where the answer showed none. Requests the server never identified have no entry."""

    seq: np.ndarray
    offset: np.ndarray
    count: np.ndarray
    ids: np.ndarray
    logprobs: np.ndarray

    @classmethod
    def load(cls, path: str | Path) -> "ServedArrays":
        with np.load(path) as arrays:
            return cls(*(arrays[name] for name in ("seq", "offset", "count", "ids", "logprobs")))

    def _span(self, seq: int) -> slice:
        found = np.flatnonzero(self.seq == seq)
        if not len(found):
            raise KeyError(f"request {seq} has no served tokens (it was not identified as a trajectory's turn)")
        at = int(found[0])
        return slice(int(self.offset[at]), int(self.offset[at] + self.count[at]))

    def tokens(self, seq: int) -> np.ndarray:
        """The token ids request `seq` was served."""
        return self.ids[self._span(seq)]

    def token_logprobs(self, seq: int) -> np.ndarray:
        """Their logprobs as the answer showed them (NaN: none shown)."""
        return self.logprobs[self._span(seq)]
