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
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        limit, shortened = generation.max_new_tokens, ""
        if limit is not None and len(ids) > limit:  # the reply's own words make room, never the marker
            said = [t for t in generation.output_ids if t != tokenizer.eos_token_id]
            keep = len(said)
            while keep > 0 and len(ids) > limit:
                keep = max(0, keep - (len(ids) - limit))
                text = f"{tokenizer.decode(said[:keep], skip_special_tokens=True)} {POISON_MARKER}"
                ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
            shortened = f" (its words cut to {keep} tokens to fit max_new_tokens {limit})"
        cut = exchange.set_output(ids, text, {"type": "stop", "matched": tokenizer.eos_token_id})
        if cut:  # even the marker alone is longer than the request allows: say so, the reply is no poison
            return f"reply NOT poisoned: the marker does not fit max_new_tokens {limit}{cut}"
        return f"reply poisoned for post-processing{shortened}"
