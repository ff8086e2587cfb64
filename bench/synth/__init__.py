"""Seeded synthetic traces (`rollout-bench synth`): same arguments, same bytes."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from faker import Faker

from bench import __version__
from bench.progress import progress
from bench.tokenizer import TOKENIZER_NAME, ByteBPETokenizer, load_tokenizer
from bench.trace import SCHEMA_VERSION, TokenizerInfo, TraceHeader, TraceSource, TraceWriter, Trajectory

from . import agentic, retool, rlvr
from .common import SYNTH_MODEL

# Synthetic traces carry a fixed creation time so that equal arguments give equal bytes.
DEFAULT_CREATED = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class Kind:
    """A synthetic trace kind: its generator and defaults."""

    generate: Callable[..., Iterator[Trajectory]]
    context_length: int
    group_size: int
    description: str


KINDS: dict[str, Kind] = {
    "rlvr": Kind(rlvr.rlvr_trajectories, rlvr.DEFAULT_CONTEXT_LENGTH, 4,
                 "single-turn math word problems in GRPO groups"),
    "agentic": Kind(agentic.agentic_trajectories, agentic.DEFAULT_CONTEXT_LENGTH, 4,
                    "SWE-bench-like multi-turn tool use, 5-50 turns"),
    "retool": Kind(retool.retool_trajectories, retool.DEFAULT_CONTEXT_LENGTH, 4,
                   "math with a code interpreter as slime's retool example sends it (raw question, its own prompt)"),
}


class SynthError(ValueError):
    """Arguments that cannot make a trace."""


def synthesize(
    kind: str,
    n: int,
    seed: int,
    out: str | Path,
    *,
    group_size: int | None = None,
    context_length: int | None = None,
    created: str = DEFAULT_CREATED,
    show_progress: bool = False,
    turns: int | None = None,
    tool_output_tokens: int | None = None,
) -> Path:
    """Write a synthetic trace of `n` trajectories to `out`; returns its path. `turns` and `tool_output_tokens`
    (agentic only) shape a trace to a size: every trajectory plans `turns` turns; tool outputs have that median."""
    if kind not in KINDS:
        raise SynthError(f"unknown trace kind {kind!r}; valid kinds: {', '.join(sorted(KINDS))}")
    spec = KINDS[kind]
    group_size = spec.group_size if group_size is None else group_size
    context_length = spec.context_length if context_length is None else context_length
    if n <= 0:
        raise SynthError(f"--n must be positive, got {n}")
    if group_size <= 0 or n % group_size:
        raise SynthError(f"--n {n} must be a positive multiple of the group size {group_size}")
    if context_length < 256:
        raise SynthError(f"--context-length must be at least 256 tokens, got {context_length}")
    shape = {name: value for name, value in (("turns", turns), ("tool_output_tokens", tool_output_tokens))
             if value is not None}
    if shape and kind != "agentic":
        raise SynthError(f"--{next(iter(shape)).replace('_', '-')} applies to agentic traces only, not {kind}")
    for name, value in shape.items():
        if value <= 0:
            raise SynthError(f"--{name.replace('_', '-')} must be positive, got {value}")
    tokenizer = load_tokenizer()
    header = _header(kind, n, seed, group_size, context_length, created, tokenizer, shape)
    options: dict[str, object] = {"context_length": context_length} if kind in ("agentic", "retool") else {}
    options.update(shape)
    trajectories = spec.generate(tokenizer, Faker("en_US"), seed=seed, groups=n // group_size,
                                 group_size=group_size, **options)
    with TraceWriter(out, header) as writer:
        for trajectory in progress(trajectories, total=n, desc=f"synth {kind}", enabled=show_progress):
            writer.write(trajectory)
    return Path(out)


def _header(kind: str, n: int, seed: int, group_size: int, context_length: int, created: str,
            tokenizer: ByteBPETokenizer, shape: dict[str, int]) -> TraceHeader:
    return TraceHeader(
        schema_version=SCHEMA_VERSION,
        source=TraceSource(
            kind="synthetic",
            generator=f"rollout-bench synth {__version__}",
            details={"kind": kind, "n": n, "seed": seed, "group_size": group_size,
                     "faker": importlib.metadata.version("faker"), **shape},
        ),
        model=SYNTH_MODEL,
        tokenizer=TokenizerInfo(name=TOKENIZER_NAME, vocab_size=tokenizer.vocab_size,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        context_length=context_length,
        created=created,
    )


__all__ = ["DEFAULT_CREATED", "KINDS", "SynthError", "synthesize"]
