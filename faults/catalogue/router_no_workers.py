"""`router_no_workers`: sglang-router's 503 when every circuit is open (WIRE 4.4), byte for byte.

`router_version = "0.2"` gives the 0.2.x plain-text answer instead of the JSON one.
"""

import random

from ..base import Fault, FaultError, register
from ..exchange import Exchange, Replacement

MESSAGE = "No available workers (all circuits open or unhealthy)"
BODY = ('{"error":{"type":"Service Unavailable","code":"no_available_workers","message":"'
        + MESSAGE + '"}}').encode()


_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def router_request_id(rng: random.Random) -> str:
    """A router-made request id: `gnt-` and 24 characters."""
    return "gnt-" + "".join(rng.choice(_ID_CHARS) for _ in range(24))


def no_workers_answer(router_version: str, request_id: str) -> Replacement:
    """The router's no-available-workers answer: the one builder the server and the faults share."""
    if router_version.startswith("0.2"):
        return Replacement(503, MESSAGE.encode(), "text/plain")
    return Replacement(503, BODY, "application/json",
                       {"x-smg-error-code": "no_available_workers", "x-request-id": request_id})


def no_workers(router_version: str, exchange: Exchange) -> Replacement:
    """The answer for a fault: its request id is drawn from the rule's seeded RNG."""
    return no_workers_answer(router_version, router_request_id(exchange.rng))


@register
class RouterNoWorkers(Fault):
    name = "router_no_workers"
    category = "http"
    router_version: str = "0.3.2"

    def check(self) -> None:
        if self.router_version not in ("0.3.2", "0.2"):
            raise FaultError(f"{self.name}: parameter 'router_version' must be one of 0.3.2, 0.2; "
                             f"got {self.router_version!r}")

    def apply(self, exchange: Exchange) -> str:
        exchange.replacement = no_workers(self.router_version, exchange)
        return "answered the router's no-available-workers 503"
