"""`hold_weights`: the trainer publishes no new weights at the start of the rule's steps (`steps = "2-3"`).

A multi-step run (`run --steps K`) advances the server's weight version before every step after the first, as a
trainer's weight sync does; during the steps this rule names the version stays where it was, as when a sync is
skipped or fails silently. Applied by the step driver (`bench.steps`) at step boundaries, never per request: of
its schedule only `steps` counts (without it, no step after the first publishes new weights). When the adapter's
trainer side publishes the weights itself (`update_weights`), the server's weight update routes answer as usual
during the rule's steps and change nothing.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class HoldWeights(Fault):
    name = "hold_weights"
    category = "protocol"
    server_side = False  # no request gets it: the bench's step driver reads it from the plan

    def apply(self, exchange: Exchange) -> str:
        raise RuntimeError("hold_weights acts at step boundaries (bench.steps), not on a request")
