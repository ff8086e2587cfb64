"""`stale_weight_version`: the answer comes from a policy `behind` versions older than the server's.

Where the answer reports a weight version (SGLang's `meta_info` / `metadata`), the reported version counts
down (floored at 0; a non-numeric one becomes `<version>-stale<k>`). vLLM's answers carry no version: its
clients stamp the policy when they send the request (open-instruct's `model_step`), so there a stale answer
is a late one. The server holds it until its weight version is `behind` past the one the request arrived at;
but a trainer that needs this very answer before it can move on would never get there, so the hold also ends
once nothing else has generated for `idle_s` seconds (only held answers are left), and after `hold_s` at most.
"""

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class StaleWeightVersion(Fault):
    name = "stale_weight_version"
    category = "protocol"
    behind: int = 1
    hold_s: float = 30.0
    idle_s: float = 1.0

    def check(self) -> None:
        if self.behind < 1:
            raise FaultError(f"{self.name}: parameter 'behind' must be at least 1; got {self.behind}")
        if self.hold_s <= 0 or self.idle_s <= 0:
            raise FaultError(f"{self.name}: parameters 'hold_s' and 'idle_s' must be positive; got {self.hold_s}, "
                             f"{self.idle_s}")

    def apply(self, exchange: Exchange) -> str:
        current = exchange.weight_version
        if exchange.api == "openai" and exchange.flavor == "vllm":
            return self._hold(exchange, current)
        stale = str(max(0, int(current) - self.behind)) if current.isdigit() else f"{current}-stale{self.behind}"
        exchange.reported_weight_version = stale
        return f"weight_version {current} -> {stale}"

    def _hold(self, exchange: Exchange, current: str) -> str:
        if not current.isdigit():
            return f"not held: weight_version {current!r} is not a number, so no newer one can be waited for"
        newer = int(current) + self.behind
        exchange.transport.until_version = newer
        exchange.transport.until_idle_s = self.idle_s
        exchange.transport.delay = max(exchange.transport.delay, self.hold_s)
        return (f"held until weight_version {newer} (arrived at {current}; {self.hold_s:g} s at most, or until "
                f"nothing else generated for {self.idle_s:g} s)")
