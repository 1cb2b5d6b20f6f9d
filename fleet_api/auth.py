"""Bearer-token check for every route but ``/api/health`` and the docs, as a pure ASGI middleware.

A middleware rather than a dependency so that the token is checked before anything else looks at
the request: an unauthenticated caller learns nothing from validation errors or unknown routes.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_api.errors import error_response

# The docs (page, packaged assets, schema) are open: a browser cannot send a bearer token when it loads a
# page, and they tell nothing about this deployment (the schema is the committed openapi.json).
OPEN_PATHS = frozenset({"/api/health", "/api/openapi.json", "/api/docs", "/docs"})
OPEN_PREFIXES = ("/api/docs/",)


class BearerAuth:
    """Answer 401 unless ``Authorization: Bearer <token>`` matches (compared in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_open(scope["path"]) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "unauthorized",
            "this API requires Authorization: Bearer <FLEET_API_TOKEN>",
            headers={"WWW-Authenticate": 'Bearer realm="fleet"'},
        )
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        scheme, _, credentials = Headers(scope=scope).get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), self.token)


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
