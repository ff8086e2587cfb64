"""`stream_cut`: a stream ends after `after` events.

`done = true` still sends `data: [DONE]` (a clean early end); `clean = false` (default)
drops the connection mid-body, as a worker dying behind the router does (WIRE 6: the
chunked body ends without its terminator; httpx raises `RemoteProtocolError`).
"""

from ..base import Fault, FaultError, register
from ..exchange import Exchange


@register
class StreamCut(Fault):
    name = "stream_cut"
    category = "transport"
    after: int = 1
    done: bool = False
    clean: bool = False

    def check(self) -> None:
        if self.after < 0:
            raise FaultError(f"{self.name}: parameter 'after' must not be negative; got {self.after}")

    def apply(self, exchange: Exchange) -> str:
        if not exchange.stream:
            return "not a stream: no effect"
        exchange.transport.cut_after_chunks = self.after
        exchange.transport.done_after_cut = self.done
        exchange.transport.reset = not self.clean and not self.done
        return f"stream cut after {self.after} events" + (" with [DONE]" if self.done else "")
