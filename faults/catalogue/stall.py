"""`stall`: no byte at all until the client gives up (or `seconds` pass): a black hole."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class Stall(Fault):
    name = "stall"
    category = "transport"
    seconds: float = 3600.0

    def apply(self, exchange: Exchange) -> str:
        exchange.transport.stall = True
        exchange.transport.delay += self.seconds
        return f"stalled (up to {self.seconds:g} s)"
