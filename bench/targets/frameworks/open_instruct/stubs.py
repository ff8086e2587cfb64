"""Import-time stand-ins for the two GPU packages open-instruct imports but this path never calls.

`vllm_utils` imports some fifteen names from vLLM (engine, server, KV-cache classes) and `data_loader` pulls in
DeepSpeed through the trainer utilities. Neither installs on a CPU machine, and the bench's server plays the
vLLM engine, so any `vllm.*` / `deepspeed.*` module resolves to a placeholder whose attributes are empty
classes. One exception: `vllm_utils` edits `MambaSpec.__dataclass_fields__["dtypes"]` at import, so that one
is a dataclass with such a field.

Ray's queue actors unpickle open-instruct objects (`PromptRequest` holds a `SamplingConfig`), so they need the
stand-ins as well: `install` is also their `worker_process_setup_hook`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..placeholders import PlaceholderFinder
from ..placeholders import install as install_finder

STUBBED = ("vllm", "deepspeed")


def _special(module: str, name: str) -> Any:
    """`MambaSpec` is a dataclass with a `dtypes` field (vllm_utils edits that field at import)."""
    if name == "MambaSpec":
        return dataclasses.make_dataclass(name, [("dtypes", tuple, ())])
    return NotImplemented


def install() -> None:
    """Put the placeholder finder first on the import path (once)."""
    install_finder(PlaceholderFinder(STUBBED, special=_special))
