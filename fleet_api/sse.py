"""A turn's events over server-sent events: ``id: seq``, ``event: type``, ``data: envelope``.

The stream only reads: it replays the turn from the store and tails it (``TurnRunner.follow``), and
closes right after the terminal event. The turn runs in the runner's own task, outside the response,
so a client that disconnects ends its iterator and nothing else. Heartbeat comments keep idle
connections (and proxies) open; a client too slow to take a frame for ``SEND_TIMEOUT_S`` is dropped
and can resume with ``Last-Event-ID``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse

from fleet_kernel.telemetry import metrics

log = logging.getLogger("fleet_api")

HEARTBEAT_S = 15.0
SEND_TIMEOUT_S = 30.0

# How the stream is described in the OpenAPI document.
SSE_RESPONSE_DOC = {
    "description": "Server-sent events: each frame is `id: <seq>`, `event: <type>`, `data: <event envelope JSON>`; "
    "comment lines are heartbeats; the stream closes right after turn.completed, turn.failed or turn.cancelled.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


async def _guarded(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    metrics.SSE_CLIENTS.inc()
    try:
        async for chunk in chunks:
            yield chunk
    except Exception:  # the status line is sent: end the stream; the client resumes with Last-Event-ID
        log.exception("a turn's event stream failed; the client can resume with Last-Event-ID")
    finally:
        metrics.SSE_CLIENTS.dec()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def event_stream(
    chunks: AsyncIterator[bytes], *, heartbeat_s: float = HEARTBEAT_S, headers: dict[str, str] | None = None
) -> EventSourceResponse:
    """The SSE response for one turn: ``chunks`` are encoded frames, already after the client's last seq,
    ending right after the terminal event."""
    return EventSourceResponse(
        _guarded(chunks),
        headers=headers,
        ping=heartbeat_s,
        sep="\n",
        send_timeout=SEND_TIMEOUT_S,
    )


def parse_last_event_id(value: str | None) -> int | None:
    """``Last-Event-ID`` as a seq; ``None`` when absent. Raises ``ValueError`` when it is not one."""
    if value is None or not value.strip():
        return None
    seq = int(value.strip())
    if seq < 0:
        raise ValueError("negative")
    return seq
