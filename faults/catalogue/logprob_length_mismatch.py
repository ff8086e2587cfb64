"""`logprob_length_mismatch`: logprob entries shorter (`delta` < 0) or longer than the output ids."""

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class LogprobLengthMismatch(Fault):
    name = "logprob_length_mismatch"
    category = "protocol"
    delta: int = -1

    def check(self) -> None:
        if self.delta == 0:
            raise FaultError(f"{self.name}: parameter 'delta' must not be 0 (negative: shorter, positive: longer)")

    def apply(self, exchange: Exchange) -> str:
        entries = exchange.entries()
        before = len(entries)
        if self.delta < 0:
            del entries[max(0, before + self.delta):]
        else:
            last = entries[-1][1] if entries else exchange.tokenizer.eos_token_id
            entries.extend((-1.0, last) for _ in range(self.delta))
        return f"logprob entries {before} -> {len(entries)} for {len(exchange.generation.output_ids)} ids"
