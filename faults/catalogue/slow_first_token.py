"""`slow_first_token`: the first token comes `seconds` late; the rest at the recorded pace."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class SlowFirstToken(Fault):
    name = "slow_first_token"
    category = "transport"
    alters_reply = False  # the recorded reply, only later
    seconds: float = 5.0

    def apply(self, exchange: Exchange) -> str:
        exchange.transport.first_token_delay += self.seconds
        return f"first token {self.seconds:g} s late"
