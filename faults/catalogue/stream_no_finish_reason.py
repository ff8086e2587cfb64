"""`stream_no_finish_reason`: a stream whose events never carry a finish reason, then `[DONE]`.

SDKs end such a stream silently; slime leaves the sample PENDING, verifiers records None.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class StreamNoFinishReason(Fault):
    name = "stream_no_finish_reason"
    category = "transport"

    def apply(self, exchange: Exchange) -> str:
        if not exchange.stream:
            return "not a stream: no effect"
        exchange.omit_finish_reason = True
        return "no event carries a finish reason"
