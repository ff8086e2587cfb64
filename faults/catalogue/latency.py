"""`latency`: extra delay before the answer: fixed `ms`, plus uniform `jitter_ms`, or lognormal.

With `distribution = "lognormal"`, `ms` is the median and `sigma` the spread. Draws are
seeded by the rule and the attempt, so reruns wait exactly as long.
"""

import math

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class Latency(Fault):
    name = "latency"
    category = "transport"
    alters_reply = False  # the recorded reply, only later
    ms: float = 100.0
    jitter_ms: float = 0.0
    distribution: str = "fixed"
    sigma: float = 1.0

    def check(self) -> None:
        if self.distribution not in ("fixed", "lognormal"):
            raise FaultError(f"{self.name}: parameter 'distribution' must be one of fixed, lognormal; "
                             f"got {self.distribution!r}")
        if self.ms < 0 or self.jitter_ms < 0:
            raise FaultError(f"{self.name}: parameters 'ms' and 'jitter_ms' must not be negative")

    def apply(self, exchange: Exchange) -> str:
        if self.distribution == "lognormal":
            delay = exchange.rng.lognormvariate(math.log(max(self.ms, 1e-3)), self.sigma)
        else:
            delay = self.ms + exchange.rng.uniform(0, self.jitter_ms)
        exchange.transport.delay += delay / 1000
        return f"delayed {delay:.1f} ms"
