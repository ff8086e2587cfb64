"""`truncated_body`: the headers promise the whole body; only a `keep` share arrives, then the connection drops.

On a stream, `keep` of the events arrive, then half of the next one, and the chunked body
ends without its terminator (a worker killed in the middle of a write).
"""

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class TruncatedBody(Fault):
    name = "truncated_body"
    category = "transport"
    keep: float = 0.5

    def check(self) -> None:
        if not 0 <= self.keep < 1:
            raise FaultError(f"{self.name}: parameter 'keep' must be in [0, 1); got {self.keep}")

    def apply(self, exchange: Exchange) -> str:
        exchange.transport.truncate_at = self.keep
        return f"body cut at {self.keep:.0%}"
