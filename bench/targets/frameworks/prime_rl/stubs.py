"""Import-time stand-ins for the GPU and service packages prime-rl's orchestrator imports but this path never calls.

`prime_rl.utils.utils` (imported by the scheduler, the buffer and the env wrapper) imports torch, wandb and
transformers at module level; other orchestrator modules reach for vLLM, NVML, flash-attention kernels and the
Prime CLI. None of them installs on a CPU machine with Python 3.11 (or is needed: the bench's server plays the
inference engine, the scheduler's code path touches no tensor), so any module of these packages resolves to a
placeholder whose attributes are empty classes, made on first use.

They must be classes, not objects: `datasets` checks `issubclass(type(x), torch.Tensor)` (and transformers'
`PreTrainedTokenizerBase`) while hashing once it sees `torch` in `sys.modules`. `install` therefore runs after
`datasets` and `verifiers` are imported, so that their own "is torch installed?" probes see the truth.
"""

from __future__ import annotations

from ..placeholders import PlaceholderFinder
from ..placeholders import install as install_finder

STUBBED = ("torch", "wandb", "transformers", "prime_cli", "pynvml", "ring_flash_attn", "liger_kernel", "vllm")


def install() -> None:
    """Put the placeholder finder first on the import path (once), after the packages that probe for torch.
    A lower-case attribute is a submodule (`torch.nn`, reached without importing it)."""
    import datasets  # noqa: F401
    import verifiers  # noqa: F401

    install_finder(PlaceholderFinder(STUBBED, lower_case_submodules=True))
