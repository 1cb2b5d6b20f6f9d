"""Request body limits, enforced on the byte stream before anything is parsed or spooled to disk.

Uploads may be as large as ``storage.max_upload_mb`` (plus multipart framing); every other body is
small JSON. A declared ``Content-Length`` over the limit is refused at once; a body that grows past
it while streaming is cut off with the same 413. A path may answer in its own words instead
(``refusals``: a wire profile whose clients expect another status and envelope).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet_api.errors import error_response

JSON_BODY_LIMIT = 2 * 1024 * 1024
MULTIPART_OVERHEAD = 64 * 1024


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        *,
        upload_limit: int,
        upload_paths: re.Pattern[str],
        raw_paths: re.Pattern[str] | None = None,
        refusals: Sequence[tuple[re.Pattern[str], Callable[[str], Response]]] = (),
    ) -> None:
        self.app = app
        self.refusals = refusals  # (path, the response for a too large body given Fleet's message)
        self.upload_limit = upload_limit
        self.upload_paths = upload_paths
        self.raw_paths = raw_paths  # raw bytes (a workspace file): the upload limit, no framing

    def _raw(self, path: str) -> bool:
        return self.raw_paths is not None and self.raw_paths.match(path) is not None

    def _limit(self, path: str) -> int:
        if self._raw(path):
            return self.upload_limit
        return self.upload_limit + MULTIPART_OVERHEAD if self.upload_paths.match(path) else JSON_BODY_LIMIT

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope["path"])
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            message = _message(limit, self.upload_paths.match(scope["path"]) is not None, self._raw(scope["path"]))
            own = next((refuse for path, refuse in self.refusals if path.match(scope["path"])), None)
            response = own(message) if own is not None else error_response(413, "payload_too_large", message)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(
                        413,
                        _message(limit, self.upload_paths.match(scope["path"]) is not None, self._raw(scope["path"])),
                    )
            return message

        await self.app(scope, limited_receive, send)


def _message(limit: int, upload: bool, raw: bool = False) -> str:
    if raw:
        return f"the file is larger than {limit / (1024 * 1024):g} MB (storage.max_upload_mb in fleet.toml)"
    if upload:
        mb = (limit - MULTIPART_OVERHEAD) / (1024 * 1024)
        return f"the upload is larger than {mb:g} MB (storage.max_upload_mb in fleet.toml)"
    return f"the request body is larger than {limit // (1024 * 1024)} MB"
