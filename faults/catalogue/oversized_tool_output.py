"""`oversized_tool_output`: the model's turn becomes a tool call whose output is `bytes` bytes.

The call is in the chat template's format (`<tool_call>` JSON) and speaks the trajectory's own tool protocol:
when its prompt announces a code tool (slime's retool example: `code_interpreter`), the call is Python code
printing `bytes` bytes, which the target's own interpreter runs; otherwise a `bash` command that prints them.
`tool` names the tool outright. Either way the next prompt overflows the context (slime#1861).
"""

import json
import struct
from typing import Any

from faults.hooks import CODE_TOOLS, oversized_tool_call

from ..base import Fault, FaultError, register
from ..exchange import Exchange

DEFAULT_TOOL = "bash"


def own_tool(announced: tuple[str, ...]) -> str:
    """The tool a faulted turn calls when the rule names none: the trajectory's code tool, else bash."""
    return next((name for name in announced if name in CODE_TOOLS), DEFAULT_TOOL)


@register
class OversizedToolOutput(Fault):
    name = "oversized_tool_output"
    category = "protocol"
    bytes: int = 100_000
    tool: str = ""  # "" = the trajectory's own tool (see `own_tool`)

    def check(self) -> None:
        if self.bytes < 1:
            raise FaultError(f"{self.name}: parameter 'bytes' must be positive; got {self.bytes}")

    watches_later = True  # the tool's output shows in the trajectory's next request, if the call was run

    def consumed_in(self, later_request: bytes, tokenizer: Any) -> bool:
        """The target ran the call: its output (a run of `x`, trimmed or not) is in a later request."""
        run = min(self.bytes, 8)
        return struct.pack(f"<{run}i", *([tokenizer.encode("x")[0]] * run)) in later_request

    def apply(self, exchange: Exchange) -> str:
        tool = self.tool or own_tool(exchange.tools)
        arguments = json.dumps(oversized_tool_call(tool, self.bytes))
        text = f'Let me look at the whole output.\n<tool_call>\n{{"name": "{tool}", "arguments": {arguments}}}\n</tool_call>'
        tokenizer = exchange.tokenizer
        cut = exchange.set_output(tokenizer.encode(text) + [tokenizer.eos_token_id], text,
                            {"type": "stop", "matched": tokenizer.eos_token_id})
        return f"turn replaced by a {tool} call printing {self.bytes} bytes{cut}"
