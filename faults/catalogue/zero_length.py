"""`zero_length`: finish reason `length` with zero tokens (a zero budget: `{"type":"length","length":0}`)."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class ZeroLength(Fault):
    name = "zero_length"
    category = "protocol"

    def apply(self, exchange: Exchange) -> str:
        exchange.set_output([], "", {"type": "length", "length": 0})
        return "answered length with 0 tokens"
