"""What every reference target shares: one framework pattern in an `unfixed` and a `fixed` variant."""

from __future__ import annotations

from typing import ClassVar

VARIANTS = ("unfixed", "fixed")


class ReferenceTarget:
    family: ClassVar[str]  # the target's name without its variant, e.g. "ref-gather"
    fail_fast: bool = False  # the framework's declared policy when one trajectory fails

    def __init__(self, variant: str = "unfixed") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"{self.family} has variants unfixed and fixed, not {variant!r}")
        self.fixed = variant == "fixed"
        self.name = f"{self.family}:{variant}"
