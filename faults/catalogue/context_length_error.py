"""`context_length_error`: the context-length 400, in the server's own words (WIRE 1.7, 3.2).

The server claims a context of `context_length` tokens (default: exactly the prompt's
length, so the prompt "is longer than" it). SGLang streams get the error in band.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class ContextLengthError(Fault):
    name = "context_length_error"
    category = "protocol"
    context_length: int = 0

    def apply(self, exchange: Exchange) -> str:
        claimed = self.context_length or exchange.generation.prompt_tokens
        exchange.refusal_context = claimed
        return f"refused: context length {claimed}"
