"""`wrong_content_type`: the real answer under another content type (router 0.1.9's octet-stream).

Streams too: the events arrive under that content type instead of `text/event-stream`.

aiohttp's `resp.json()` then refuses it (AReaL retries, slime gets a `str`).
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class WrongContentType(Fault):
    name = "wrong_content_type"
    category = "http"
    content_type: str = "application/octet-stream"

    def apply(self, exchange: Exchange) -> str:
        exchange.content_type = self.content_type
        return f"content type {self.content_type}"
