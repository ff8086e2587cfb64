"""`missing_logprobs`: the answer carries no `output_token_logprobs` although they were asked for.

slime and miles then append zero tokens silently; verl and AReaL raise KeyError (WIRE 5.2).
On the OpenAI routes the `logprobs` field is null.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class MissingLogprobs(Fault):
    name = "missing_logprobs"
    category = "protocol"

    def apply(self, exchange: Exchange) -> str:
        exchange.omit_logprobs = True
        return f"dropped the logprobs of {len(exchange.generation.output_ids)} tokens"
