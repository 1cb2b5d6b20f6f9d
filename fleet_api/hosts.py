"""Answer only for this server's own names, so a DNS-rebinding page cannot reach any route.

A page on ``http://rebind.evil.example:8000`` whose name is re-pointed at 127.0.0.1 talks to this
server as if it were its own origin, but its requests still say ``Host: rebind.evil.example:8000``.
So a request is served only when its ``Host`` (any port) names

- the address the connection arrived on (an IP literal cannot be rebound), or a loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``) when that address is loopback;
- the host ``fleet serve --host`` was given, unless it is a wildcard (``0.0.0.0``, ``::``);
- a name in ``FLEET_ALLOWED_HOSTS`` (a reverse proxy's public name).

Everything else, ``/api/health`` included, is a 421 before routing, authentication or parsing.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_api.auth import is_loopback
from fleet_api.errors import error_response
from fleet_kernel.config import canonical_host

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::"})  # noqa: S104 - names the wildcards, binds nothing


def split_authority(authority: str) -> tuple[str | None, int | None]:
    """The canonical host and the port (None when not given) of a ``Host`` header or an origin's
    ``host[:port]``; the host is None when it is malformed."""
    authority = authority.strip()
    if authority.startswith("["):
        host, closed, port = authority.partition("]")
        host += closed
    else:
        host, _, port = authority.partition(":")
        port = f":{port}" if port else ""
    if port and not (port.startswith(":") and port[1:].isdigit()):
        return None, None
    return canonical_host(host), int(port[1:]) if port else None


def host_of(authority: str) -> str | None:
    """The canonical host of a ``Host`` header or an origin's ``host[:port]``; None when malformed."""
    return split_authority(authority)[0]


def own_names(allowed_hosts: Iterable[str], bind_host: str | None) -> frozenset[str]:
    """The configured names plus the bind host when it names one interface."""
    names = set(allowed_hosts)
    bound = canonical_host(bind_host) if bind_host else None
    if bound is not None and bound not in WILDCARDS:
        names.add(bound)
    return frozenset(names)


class AllowedHosts:
    """Answer 421 unless the request's ``Host`` is one of this server's names (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = Headers(scope=scope).get("host", "")
        host = host_of(raw)
        if host is not None and self.allows(host, scope):
            await self.app(scope, receive, send)
            return
        named = f"host {raw!r}" if raw else "a request without a Host header"
        response = error_response(
            421,
            "host_not_allowed",
            f"this API does not answer for {named}; use 127.0.0.1 or localhost, or, if that name reaches "
            "this server (for example through a reverse proxy), add it to FLEET_ALLOWED_HOSTS",
        )
        await response(scope, receive, send)

    def allows(self, host: str, scope: Scope) -> bool:
        if host in self.names:
            return True
        server = scope.get("server")
        local = canonical_host(str(server[0])) if server else None
        if local is None:
            return False
        return host == local or (is_loopback(local) and host in LOOPBACK_NAMES)
