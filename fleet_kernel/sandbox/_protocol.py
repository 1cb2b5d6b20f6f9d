"""The host's side of the sandbox byte stream: errors and bounded line reading, free of heavy imports.

Kept apart from ``interpreter.py`` (which needs dspy) so that choosing and probing a backend stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # longest protocol line a host reader holds in memory


class SessionClosed(Exception):
    """The sandbox process ended; the message says why (out of memory, crash, killed)."""


class ProtocolError(Exception):
    """The sandbox sent something that is not a protocol message."""


def protocol_lines(stream: IO[bytes], limit: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """The lines of a sandbox's protocol stream, never holding more than ``limit`` bytes of one.

    Sandboxed code can write to its end of the channel; without a bound, a line without a newline
    would grow in the host's memory until the host ran out of it.

    Raises:
        ProtocolError: a line is longer than ``limit`` bytes.
    """
    while line := stream.readline(limit + 1):
        if len(line) > limit:
            raise ProtocolError(f"sent a message larger than {limit // (1024 * 1024)} MiB")
        yield line
