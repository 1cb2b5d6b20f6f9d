"""Stored bytes as an HTTP response: the recorded content type, and headers that keep it inert."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Response


def content_response(data: bytes, *, mime: str, filename: str, sha256: str) -> Response:
    """Serve model- or user-supplied bytes so a browser shows them but never runs them as this origin."""
    return Response(
        content=data,
        media_type=mime,
        headers={
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(filename)}",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'",
            "ETag": f'"{sha256}"',
            "Cache-Control": "private, max-age=31536000, immutable",
        },
    )
