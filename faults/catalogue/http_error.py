"""`http_error`: an HTTP error status with the body the real stack sends for it.

Native routes answer as SGLang (400 ValueError JSON, 404 FastAPI, 500 plain text, 503 the
scheduler's timeout), OpenAI routes in their flavor's envelope; 429 is the router's (empty
body, no content type) and 502/504 a fronting proxy's HTML page. `retry_after` adds a
`Retry-After` header (seconds).
"""

import json

from ..base import Fault, FaultError, register
from ..exchange import Exchange, Replacement

_PROXY_PAGE = "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
_REASONS = {400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Time-out"}
_OPENAI_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
                 500: "InternalServerError", 503: "ServiceUnavailableError"}


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(status: int, api: str, flavor: str) -> tuple[bytes, str | None]:
    """(body, content type) of a real error answer with this status."""
    if status == 429:
        return b"", None
    if status in (502, 504):
        return _PROXY_PAGE.format(code=status, reason=_REASONS[status]).encode(), "text/html"
    if api == "openai":
        message = f"{_REASONS.get(status, 'Error')}: injected by rollout-bench"
        error = {"message": message, "type": _OPENAI_TYPES.get(status, "APIError"), "param": None, "code": status}
        return _json({"error": error} if flavor == "vllm" else {"object": "error", **error}), "application/json"
    if status == 400:
        return _json({"error": {"message": "Invalid request: injected by rollout-bench."}}), "application/json"
    if status == 404:
        return _json({"detail": "Not Found"}), "application/json"
    if status == 500:
        return b"Internal Server Error", "text/plain"
    message = "Request running timeout reached." if status == 503 else _REASONS.get(status, "Error")
    return _json({"object": "error", "message": message, "type": str(status), "param": None,
                  "code": status}), "application/json"


@register
class HttpError(Fault):
    name = "http_error"
    category = "http"
    status: int = 500
    retry_after: float = 0.0

    def check(self) -> None:
        if not 400 <= self.status <= 599:
            raise FaultError(f"{self.name}: parameter 'status' must be an HTTP error status (400-599); "
                             f"got {self.status}")

    def apply(self, exchange: Exchange) -> str:
        body, content_type = error_body(self.status, exchange.api, exchange.flavor)
        headers = {"Retry-After": f"{self.retry_after:g}"} if self.retry_after > 0 else {}
        exchange.replacement = Replacement(self.status, body, content_type, headers)
        return f"answered HTTP {self.status}" + (f" with Retry-After {self.retry_after:g}" if headers else "")
