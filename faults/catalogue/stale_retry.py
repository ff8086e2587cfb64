"""`stale_retry`: the adapter resubmits an aborted sample object carrying the previous attempt's
fields (tokens, logprobs, loss mask), as a rollout manager's requeue does (slime#1861 (1)).

Client-side: the server never applies it; target adapters read it from the plan.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class StaleRetry(Fault):
    name = "stale_retry"
    category = "client"
    server_side = False
    keep_tokens: bool = True

    def apply(self, exchange: Exchange) -> str:
        raise RuntimeError("stale_retry is applied by the target adapter, not by the server")
