"""`abort_all_on_weight_update`: every weight-version change aborts every request in flight.

Even updates sent with `abort_all_requests: false` (miles#2372, #2589: ~65 aborts per update).
The server applies it when a weight update arrives, not per request.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class AbortAllOnWeightUpdate(Fault):
    name = "abort_all_on_weight_update"
    category = "protocol"
    on_weight_update = True

    def apply(self, exchange: Exchange) -> str:
        return "no per-request effect"
