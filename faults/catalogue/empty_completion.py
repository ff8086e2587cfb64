"""`empty_completion`: the model stops at once: finish `stop`, no tokens, empty text."""

from ..base import Fault, register
from ..exchange import Exchange


@register
class EmptyCompletion(Fault):
    name = "empty_completion"
    category = "protocol"

    def apply(self, exchange: Exchange) -> str:
        exchange.set_output([], "", {"type": "stop", "matched": exchange.tokenizer.eos_token_id})
        return "answered stop with 0 tokens"
