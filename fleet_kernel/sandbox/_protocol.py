"""The host's side of the sandbox protocol: what a session is, its errors, and bounded line reading.

Free of heavy imports, kept apart from ``interpreter.py`` (which needs dspy), so that choosing and probing
a backend stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from typing import IO, Any, Protocol

from fleet_kernel.sandbox.runtime import HostMessage, MessageType

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # longest protocol line a host reader holds in memory
READ_CHUNK_BYTES = 1 << 20  # read from the pipe at once (its size): big messages in few reads
WAIT_SLICE_S = 0.1  # a wait for the pipe is cut into slices, so ``kill`` never waits long for the reader


class SessionClosed(Exception):
    """The sandbox process ended; the message says why (out of memory, crash, killed)."""


class ProtocolError(Exception):
    """The sandbox sent something that is not a protocol message."""


class SandboxSession(Protocol):
    """One running sandbox speaking the ``runtime.py`` protocol; backends implement this."""

    def start(self) -> None:
        """Start the sandbox and wait for its ``ready`` message; raise ``SessionClosed`` if it cannot start."""

    def send(self, message: HostMessage) -> None:
        """Send one message (thread-safe); raise ``SessionClosed`` when the sandbox is gone."""

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """Next message, or ``None`` after ``timeout``; raise ``SessionClosed``/``ProtocolError``."""

    def interrupt(self) -> None:
        """Ask the running code to stop (``KeyboardInterrupt``); never blocks."""

    def kill(self) -> None:
        """Stop the sandbox now and release its resources; idempotent."""


class PipeSession:
    """A sandbox process speaking the runtime protocol as JSON lines on its stdin/stdout.

    Shared by the ``local`` and ``pyodide`` backends: send, receive, interrupt and kill. A subclass
    starts the process, hands it to ``_attach`` and says why it died (``_death_reason``).

    The host reads the process's stdout on the thread that waits for a message (``receive``), not on
    a reader thread: a reply reaches the turn without a hop between threads, and nothing is read while
    nobody waits. Code can write to its end of the channel at any time (a background process, between
    executions too); what it writes between executions fills the pipe and blocks. At most one line
    and one read (``READ_CHUNK_BYTES``) are held, and a line is never longer than ``message_limit``.
    """

    start_timeout_s = 10.0
    message_limit = MAX_MESSAGE_BYTES

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._cgroup: Any = None
        self._stdout_fd = -1
        self._buffer = bytearray()  # read from stdout, not yet taken as messages
        self._scanned = 0  # bytes of ``_buffer`` known to hold no newline
        self._eof = False  # the pipe ended, or ``kill`` closed it
        self._read_lock = threading.Lock()  # one reader at a time; ``kill`` closes stdout under it
        self._send_lock = threading.Lock()
        self._stderr_tail = b""
        self._reason: str | None = None

    def _attach(self, process: subprocess.Popen[bytes], *, wait: bool = True) -> None:
        """Take the new process's pipes and (``wait``) wait for its ``ready`` message."""
        if process.stdout is None:
            raise ValueError("a sandbox process is started with stdout=PIPE: the protocol comes through it")
        self._process, self._stdout_fd = process, process.stdout.fileno()
        threading.Thread(target=self._read_stderr, args=(process.stderr,), daemon=True).start()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait for the ``ready`` message of a process attached with ``wait=False``."""
        try:
            ready = self.receive(self.start_timeout_s)
        except (SessionClosed, ProtocolError) as exc:
            self.kill()
            raise SessionClosed(f"exited during start-up: {exc}") from exc
        if ready is None or ready.get("type") != MessageType.READY:
            self.kill()
            raise SessionClosed(f"did not become ready within {self.start_timeout_s:g} s (got {ready!r})")

    def _read_stderr(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
                self._stderr_tail = (self._stderr_tail + chunk)[-16384:]

    def send(self, message: HostMessage) -> None:
        data = json.dumps(message).encode() + b"\n"
        with self._send_lock:
            process = self._process
            if process is None or process.stdin is None:
                raise SessionClosed("has been stopped")
            try:
                process.stdin.write(data)
                process.stdin.flush()
            except (OSError, ValueError) as exc:
                raise SessionClosed(self._death_reason()) from exc

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or ``None`` when none arrives within ``timeout`` seconds.

        Raises:
            SessionClosed: the process ended (or was killed).
            ProtocolError: it sent something that is not a protocol message.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._read_lock:
                line = self._next_line()
                if line is None and not self._eof:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self._read(min(remaining, WAIT_SLICE_S))
                    continue
            if line is None:  # outside the lock: the reason may wait for the process to exit
                raise SessionClosed(self._death_reason())
            try:
                message = json.loads(line)
            except ValueError:
                raise ProtocolError(f"not a JSON message: {line[:200]!r}") from None
            if not isinstance(message, dict):
                raise ProtocolError(f"not a message: {line[:200]!r}")
            return message

    def _next_line(self) -> bytes | None:
        """Take one complete line from the buffer, if it holds one (caller holds ``_read_lock``)."""
        end = self._buffer.find(b"\n", self._scanned)
        if (len(self._buffer) if end < 0 else end + 1) > self.message_limit:  # a line, finished or not
            raise ProtocolError(f"sent a message larger than {self.message_limit // (1024 * 1024)} MiB")
        if end < 0:
            self._scanned = len(self._buffer)
            return None
        line = bytes(memoryview(self._buffer)[: end + 1])
        del self._buffer[: end + 1]
        self._scanned = 0
        return line

    def _read(self, timeout: float) -> None:
        """Read what stdout has within ``timeout`` (caller holds ``_read_lock``)."""
        try:
            readable, _, _ = select.select([self._stdout_fd], [], [], timeout)
            if readable:
                data = os.read(self._stdout_fd, READ_CHUNK_BYTES)
                self._buffer += data
                self._eof = not data
        except (OSError, ValueError):  # the pipe is closed
            self._eof = True

    def interrupt(self) -> None:
        with contextlib.suppress(SessionClosed):
            self.send({"type": MessageType.INTERRUPT, "id": None})

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            with self._read_lock:  # a waiting ``receive`` sees EOF and lets go within a slice
                self._stdout_fd, self._eof = -1, True
                for stream in (process.stdin, process.stdout, process.stderr):
                    with contextlib.suppress(OSError):
                        if stream is not None:
                            stream.close()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            cgroup.remove()

    def _exit_code(self) -> int | None:
        if self._process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._process.wait(timeout=2)
        return None

    def _death_reason(self) -> str:
        """Why the process ended, in words the model can act on (computed once by ``_explain_death``)."""
        if self._reason is None:
            self._reason = self._explain_death()
        return self._reason

    def _explain_death(self) -> str:
        return f"exited unexpectedly (status {self._exit_code()})"
