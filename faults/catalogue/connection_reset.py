"""`connection_reset`: the connection drops before any answer (clients see a reset / disconnect)."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class ConnectionReset(Fault):
    name = "connection_reset"
    category = "transport"

    def apply(self, exchange: Exchange) -> str:
        exchange.transport.reset = True
        return "connection reset"
