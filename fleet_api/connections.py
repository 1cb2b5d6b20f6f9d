"""uvicorn's h11 protocol with two bounds it lacks: a deadline for each request head, and a cap on
open connections that idle ones give way to.

uvicorn closes idle keep-alive connections, but its timer stops at the first byte, and a fresh
connection has none: a client that sends half a request head and stops holds its socket forever
(slowloris). Here a head must be complete ``header_timeout_s`` after the connection opens, or after
the first byte of a later request on a kept-alive connection; otherwise the server answers 408 and
closes. At most ``max_connections`` are open, so a flood cannot use up the process's file
descriptors; when a new one would pass the cap, the connection that has been idle longest (no
request in progress: a fresh socket, a half-sent head, a kept-alive one between requests) is closed
to make room, so hundreds of idle sockets cannot lock out a client that sends its request. Only when
every connection is serving a request is the new one closed. Request bodies and streamed responses
are not timed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("fleet_api")

WARN_EVERY_S = 10.0


def _timeout_response(header_timeout_s: float) -> bytes:
    message = f"the request head did not arrive within {header_timeout_s:g} s"
    body = json.dumps({"error": {"code": "request_timeout", "message": message}}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class BoundedH11Protocol(H11Protocol):
    """One connection; ``bounded_h11`` makes the subclass with this server's bounds."""

    header_timeout_s: float = 10.0
    max_connections: int = 500
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._idle_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_since = self.loop.time()
        if len(self.connections) > self.max_connections:
            self._warn_full()
            victim = self._longest_idle()
            if victim is None:
                transport.close()
                return
            victim.transport.close()
            self.connections.discard(victim)  # it is closing: make room now, not when the loop sees it go
        self._arm()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()

    @property
    def idle(self) -> bool:
        """No request in progress (uvicorn's own test before closing a connection at shutdown)."""
        return not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)

    def _longest_idle(self) -> BoundedH11Protocol | None:
        idle = [c for c in self.connections if c is not self and isinstance(c, BoundedH11Protocol) and c.idle]
        return min(idle, key=lambda c: c._idle_since, default=None)

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head is complete (or the connection failed)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.write(_timeout_response(self.header_timeout_s))
            self.transport.close()

    def _warn_full(self) -> None:
        now = time.monotonic()
        if now - BoundedH11Protocol._last_warning > WARN_EVERY_S:
            BoundedH11Protocol._last_warning = now
            log.warning("%d connections are open; closing the longest idle ones to make room", self.max_connections)


def bounded_h11(header_timeout_s: float, max_connections: int) -> type[BoundedH11Protocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    bounds = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
    return type("BoundedH11Protocol", (BoundedH11Protocol,), bounds)
