"""`text_without_ids`: an OpenAI-route answer with text but none of vLLM's token-id fields.

What real SGLang <= 0.5.15 sends; verifiers then records `tokens=None` without an error.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class TextWithoutIds(Fault):
    name = "text_without_ids"
    category = "protocol"
    apis = frozenset({"openai"})

    def apply(self, exchange: Exchange) -> str:
        exchange.omit_token_ids = True
        return "dropped prompt_token_ids and token_ids"
