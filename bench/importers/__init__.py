"""`rollout-bench import`: framework dumps turned into trace v1 (`source.kind = "recorded"`).

One module per dump kind; `common` holds the tokenizer decision and the checked, all-or-nothing write;
`safe_pickle` reads pickles and `torch.save` files without running code from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .common import DumpError, ImportOptions, ImportSummary
from .sglang_dump import import_sglang_dump
from .slime_debug import import_slime_debug

Importer = Callable[[Path, Path, ImportOptions], ImportSummary]

IMPORTERS: dict[str, Importer] = {
    "slime-debug": import_slime_debug,
    "miles-debug": import_slime_debug,  # miles writes slime's format
    "sglang-dump": import_sglang_dump,
}


def import_dump(kind: str, path: str | Path, out: str | Path, options: ImportOptions | None = None) -> ImportSummary:
    """Import the dump at `path` (a file or a folder of them) into the trace `out`."""
    if kind not in IMPORTERS:
        raise ValueError(f"unknown dump kind {kind!r}; one of {', '.join(IMPORTERS)}")
    return IMPORTERS[kind](Path(path), Path(out), options or ImportOptions())


__all__ = ["DumpError", "IMPORTERS", "ImportOptions", "ImportSummary", "import_dump"]
