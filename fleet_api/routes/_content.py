"""Stored bytes as an HTTP response: the recorded content type, and headers that keep it inert."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import quote

from fastapi import Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from fleet_kernel.safe_files import OpenFile


def _inert(filename: str, sha256: str) -> dict[str, str]:
    return {
        "Content-Disposition": f"inline; filename*=UTF-8''{quote(filename)}",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'",
        "ETag": f'"{sha256}"',
        "Cache-Control": "private, max-age=31536000, immutable",
    }


def content_response(data: bytes, *, mime: str, filename: str, sha256: str) -> Response:
    """Serve model- or user-supplied bytes so a browser shows them but never runs them as this origin."""
    return Response(content=data, media_type=mime, headers=_inert(filename, sha256))


class FileStream(StreamingResponse):
    """An opened file sent in ``safe_files.CHUNK`` pieces read through its one descriptor, so serving a
    large file holds one chunk, not the file; the descriptor is closed when the response ends."""

    def __init__(self, opened: OpenFile, *, mime: str, filename: str) -> None:
        self.opened = opened
        headers = {**_inert(filename, opened.sha256), "Content-Length": str(opened.size)}
        super().__init__(self._chunks(), media_type=mime, headers=headers)

    async def _chunks(self) -> AsyncIterator[bytes]:
        offset = 0
        while chunk := await asyncio.to_thread(self.opened.chunk, offset):
            offset += len(chunk)
            yield chunk

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.opened.close()
