"""`oversized_tool_output`: the model's turn becomes a tool call whose output is `bytes` bytes.

The call is in the chat template's format (`<tool_call>` JSON); its command prints exactly
`bytes` bytes when a target executes it, so the next prompt overflows the context (slime#1861).
"""

import json
import struct
from typing import Any

from faults.hooks import emit_command

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class OversizedToolOutput(Fault):
    name = "oversized_tool_output"
    category = "protocol"
    bytes: int = 100_000
    tool: str = "bash"

    def check(self) -> None:
        if self.bytes < 1:
            raise FaultError(f"{self.name}: parameter 'bytes' must be positive; got {self.bytes}")

    watches_later = True  # the tool's output shows in the trajectory's next request, if the call was run

    def consumed_in(self, later_request: bytes, tokenizer: Any) -> bool:
        """The target ran the call: its output (a run of `x`, trimmed or not) is in a later request."""
        run = min(self.bytes, 8)
        return struct.pack(f"<{run}i", *([tokenizer.encode("x")[0]] * run)) in later_request

    def apply(self, exchange: Exchange) -> str:
        arguments = json.dumps({"command": emit_command(self.bytes)})
        text = f'Let me look at the whole output.\n<tool_call>\n{{"name": "{self.tool}", "arguments": {arguments}}}\n</tool_call>'
        tokenizer = exchange.tokenizer
        exchange.set_output(tokenizer.encode(text) + [tokenizer.eos_token_id], text,
                            {"type": "stop", "matched": tokenizer.eos_token_id})
        return f"turn replaced by a {self.tool} call printing {self.bytes} bytes"
