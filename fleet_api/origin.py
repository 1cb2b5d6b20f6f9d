"""No change from another site: state-changing requests must come from this server's own origin and,
with a body, must not be a type an HTML form or a ``no-cors`` fetch can send without a preflight.

A browser sends a cross-site "simple" request (``POST`` with no body, or a form, ``text/plain`` or
type-less body) without asking first; only the answer is hidden from the page. So for ``POST``,
``PUT``, ``PATCH`` and ``DELETE``:

- ``Sec-Fetch-Site: cross-site`` or ``same-site`` is refused (403), as is an ``Origin`` that is not
  this server's: scheme, host and port must be the request's own (``http://`` plus its ``Host``), or
  the host a name in ``FLEET_ALLOWED_HOSTS`` (a reverse proxy's, over http or https) with the
  ``Host``'s port or its scheme's default one. Another port of the same host is another origin (a
  page on ``http://127.0.0.1:3000`` is not this server on ``:8000``), whatever ``Sec-Fetch-Site``
  says or omits. ``Origin: null`` (sandboxed frames, ``file:`` pages) is foreign too;
- a body must be ``application/json``; on the upload path, ``multipart/form-data`` (a form can send
  that, so there the Origin rule above is what stops a page); on a raw-bytes path (a workspace file's
  ``PUT``), ``application/octet-stream``, which no form and no ``no-cors`` fetch can send, so a page
  can only send it after a CORS preflight this API never answers (415 otherwise).

Clients that are not browsers send neither header and are unaffected. A path no route serves
skips the media-type rule, so a mistyped URL answers 404 whatever its body is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet_api.errors import error_response
from fleet_api.hosts import host_of, split_authority

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"
MULTIPART = "multipart/form-data"
OCTETS = "application/octet-stream"


class SameOriginWrites:
    """Refuse state changes from other origins (403) and bodies of the wrong media type (415).

    ``names`` are the configured proxy names (``FLEET_ALLOWED_HOSTS``), not every name the server answers for.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        names: frozenset[str],
        upload_paths: re.Pattern[str],
        raw_paths: re.Pattern[str] | None = None,
        routed: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.names = names
        self.upload_paths = upload_paths
        self.raw_paths = raw_paths
        self.routed = routed  # whether a route serves this method and path (the rest is the router's 404/405)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        response = self._cross_site(scope, headers)
        if response is None and (self.routed is None or self.routed(scope)):
            response = self._wrong_media(scope["path"], headers)
        if response is None:
            await self.app(scope, receive, send)
        else:
            await response(scope, receive, send)

    def _cross_site(self, scope: Scope, headers: Headers) -> JSONResponse | None:
        method = scope["method"]
        site = headers.get("sec-fetch-site", "").lower()
        origin = headers.get("origin")
        if site in ("cross-site", "same-site"):
            source = f"a page on another {'site' if site == 'cross-site' else 'origin of this site'}"
        elif origin is not None and not self._own_origin(origin, scope.get("scheme", "http"), headers.get("host", "")):
            source = f"a page on {origin}"
        else:
            return None
        return error_response(
            403,
            "cross_origin_refused",
            f"refused {method} from {source}: this API accepts changes only from its own origin. "
            "If that page is this server behind a reverse proxy, add its name to FLEET_ALLOWED_HOSTS",
        )

    def _own_origin(self, origin: str, own_scheme: str, host: str) -> bool:
        scheme, sep, authority = origin.strip().lower().partition("://")
        if not sep or scheme not in ("http", "https") or "/" in authority:
            return False  # "null", or not an origin at all
        if scheme == own_scheme and authority == host.strip().lower():
            return True  # this very origin
        if host_of(authority) not in self.names:
            return False
        port, own_port = split_authority(authority)[1], split_authority(host)[1]
        return port is None or port == own_port  # a proxy's name on its default port, or the port used here

    def _wrong_media(self, path: str, headers: Headers) -> JSONResponse | None:
        declared = headers.get("content-type")
        has_body = headers.get("content-length", "0").strip() != "0" or "transfer-encoding" in headers
        if declared is None and not has_body:
            return None
        raw = self.raw_paths is not None and self.raw_paths.match(path) is not None
        wanted = MULTIPART if self.upload_paths.match(path) else OCTETS if raw else JSON
        if declared is not None and declared.partition(";")[0].strip().lower() == wanted:
            return None
        if wanted == OCTETS:
            how = "send the file's bytes as the body with Content-Type: application/octet-stream"
        elif wanted == MULTIPART:
            how = "upload with multipart/form-data (fields file and session_id)"
        else:
            how = "send the body as JSON with Content-Type: application/json"
        return error_response(415, "unsupported_media_type", f"{how}; got {declared or 'no Content-Type'}")
