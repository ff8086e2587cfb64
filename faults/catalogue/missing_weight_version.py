"""`missing_weight_version`: the answer has no `weight_version` (cf. slime#1514 `KeyError`)."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class MissingWeightVersion(Fault):
    name = "missing_weight_version"
    category = "protocol"

    def apply(self, exchange: Exchange) -> str:
        exchange.omit_weight_version = True
        return "dropped weight_version"
