"""`outage`: every request fails while the schedule holds (a `window` of seconds or a `turns` range).

The circuit-open case: by default the router's no-available-workers 503; `status` other
than 503 answers that HTTP error instead (as `http_error` does).
"""

from ..base import Fault, register
from ..exchange import Exchange, Replacement
from .http_error import error_body
from .router_no_workers import no_workers


@register
class Outage(Fault):
    name = "outage"
    category = "http"
    status: int = 503
    router_version: str = "0.3.2"

    def apply(self, exchange: Exchange) -> str:
        if self.status == 503:
            exchange.replacement = no_workers(self.router_version, exchange)
            return "outage: router has no available workers"
        body, content_type = error_body(self.status, exchange.api, exchange.flavor)
        exchange.replacement = Replacement(self.status, body, content_type)
        return f"outage: HTTP {self.status}"
