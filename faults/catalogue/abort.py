"""`abort`: the request ends aborted, as after `/abort_request` (WIRE 1.6).

`mode = "running"` keeps a `keep` share of the tokens with finish reason
`{"type":"abort","message":"Aborted",...}`; `mode = "queued"` answers the reduced
"Abort in waiting queue" / "Abort before prefill" shape with no tokens.
"""

from ..base import Fault, FaultError, register
from ..exchange import Exchange

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


@register
class Abort(Fault):
    name = "abort"
    category = "protocol"
    mode: str = "running"
    keep: float = 0.5

    def check(self) -> None:
        if self.mode not in ("running", "queued"):
            raise FaultError(f"{self.name}: parameter 'mode' must be one of running, queued; got {self.mode!r}")
        if not 0 <= self.keep <= 1:
            raise FaultError(f"{self.name}: parameter 'keep' must be in [0, 1]; got {self.keep}")

    def apply(self, exchange: Exchange) -> str:
        generation = exchange.generation
        if self.mode == "queued":
            exchange.queued_abort = True
            return "aborted in the waiting queue"
        kept = int(len(generation.output_ids) * self.keep)
        generation.output_ids = generation.output_ids[:kept]
        if generation.logprobs is not None:
            generation.logprobs = generation.logprobs[:kept]
        generation.text = exchange.tokenizer.decode(generation.output_ids, skip_special_tokens=True)
        generation.finish_reason = dict(ABORTED)
        exchange.logprob_entries = None
        return f"aborted after {kept} tokens"
