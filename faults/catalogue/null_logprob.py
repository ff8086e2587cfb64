"""`null_logprob`: one logprob entry is `null` (the first position, or `position`)."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class NullLogprob(Fault):
    name = "null_logprob"
    category = "protocol"
    position: int = 0

    def apply(self, exchange: Exchange) -> str:
        entries = exchange.entries()
        if not entries:
            return "no tokens: nothing to null"
        at = min(self.position, len(entries) - 1)
        entries[at] = (None, entries[at][1])
        return f"logprob {at} set to null"
