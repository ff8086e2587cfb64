"""`nan_logprob`: one logprob entry is NaN, written as the bare `NaN` token a Python JSON encoder emits."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class NanLogprob(Fault):
    name = "nan_logprob"
    category = "protocol"
    position: int = 0

    def apply(self, exchange: Exchange) -> str:
        entries = exchange.entries()
        if not entries:
            return "no tokens: nothing to set to NaN"
        at = min(self.position, len(entries) - 1)
        entries[at] = (float("nan"), entries[at][1])
        exchange.allow_nan = True
        return f"logprob {at} set to NaN"
