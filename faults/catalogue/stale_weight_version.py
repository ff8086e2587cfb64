"""`stale_weight_version`: the answer reports a policy `behind` versions older than the server's.

Numeric versions count down (floored at 0); a non-numeric one becomes `<version>-stale<k>`.
"""

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class StaleWeightVersion(Fault):
    name = "stale_weight_version"
    category = "protocol"
    behind: int = 1

    def check(self) -> None:
        if self.behind < 1:
            raise FaultError(f"{self.name}: parameter 'behind' must be at least 1; got {self.behind}")

    def apply(self, exchange: Exchange) -> str:
        current = exchange.weight_version
        stale = str(max(0, int(current) - self.behind)) if current.isdigit() else f"{current}-stale{self.behind}"
        exchange.reported_weight_version = stale
        return f"weight_version {current} -> {stale}"
