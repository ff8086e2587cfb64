"""`malformed_json`: a 200 `application/json` answer whose JSON is cut in the middle.

Clients' `resp.json()` raises a decode error (the OpenAI SDK: `json.JSONDecodeError`, unretried).
On a stream, one event carries the cut JSON.
"""

from ..base import Fault, register
from ..exchange import Exchange


@register
class MalformedJson(Fault):
    name = "malformed_json"
    category = "http"

    def apply(self, exchange: Exchange) -> str:
        exchange.corrupt_json = True
        return "JSON body cut in the middle"
