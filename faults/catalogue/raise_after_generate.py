"""`raise_after_generate`: a valid reply that makes the target's post-processing raise.

The reply carries `faults.hooks.POISON_MARKER`; adapters call `faults.hooks.raise_if_poisoned`
where real code would parse or score the reply (slime#2078: one trajectory in ~400).
"""

from faults.hooks import POISON_MARKER

from ..base import Fault, register
from ..exchange import Exchange


@register
class RaiseAfterGenerate(Fault):
    name = "raise_after_generate"
    category = "protocol"

    def apply(self, exchange: Exchange) -> str:
        generation, tokenizer = exchange.generation, exchange.tokenizer
        text = f"{generation.text} {POISON_MARKER}"
        exchange.set_output(tokenizer.encode(text) + [tokenizer.eos_token_id], text,
                            {"type": "stop", "matched": tokenizer.eos_token_id})
        return "reply poisoned for post-processing"
