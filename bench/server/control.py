"""The control token: who may drive `/bench/*` (swap the fault plan, read the logs, take workers away).

On a loopback bind only this machine's users reach the server and no token is needed. A bind beyond it
(`--host 0.0.0.0`) gets a token, given or generated at start and printed once; `/bench/*` then refuses
requests that do not carry it (401, with a request-log row like any other request).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from aiohttp import web

from . import wire

CONTROL_HEADER = "X-Bench-Control-Token"
CONTROL_TOKEN_KEY = web.AppKey("control_token", str)
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; anything else (0.0.0.0, ::, a LAN address, a name) is not."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def control_token_for(host: str, given: str | None) -> str | None:
    """The token a server bound to `host` requires: the one given, else a fresh one off loopback, else none."""
    if given is not None:
        if not given.strip():
            raise ValueError("--control-token must not be empty")
        return given
    return None if is_loopback(host) else secrets.token_urlsafe(24)


def presented_token(request: web.Request) -> str:
    """The token a request carries: the bench's header, or `Authorization: Bearer <token>`."""
    if CONTROL_HEADER in request.headers:
        return request.headers[CONTROL_HEADER]
    kind, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if kind.lower() == "bearer" else ""


def token_matches(request: web.Request, token: str) -> bool:
    """Whether the request carries the control token (compared in constant time)."""
    return hmac.compare_digest(presented_token(request).encode(), token.encode())


def token_refusal(request: web.Request) -> web.Response:
    """The 401 a `/bench/*` request without the token gets (the request guard logs it like any other)."""
    return wire.json_response({"error": {
        "message": f"{request.path} needs the control token printed when the server started "
                   f"(header {CONTROL_HEADER}: <token>, or Authorization: Bearer <token>)",
        "type": "bench_control_token"}}, 401)
