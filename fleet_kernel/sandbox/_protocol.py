"""The host's side of the sandbox byte stream: errors and bounded line reading, free of heavy imports.

Kept apart from ``interpreter.py`` (which needs dspy) so that choosing and probing a backend stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import IO, Any

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # longest protocol line a host reader holds in memory
READ_AHEAD_BYTES = 16 * 1024 * 1024  # protocol bytes read but not yet taken by the host (past one message)


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


_EOF = object()


class PipeSession:
    """A sandbox process speaking the runtime protocol as JSON lines on its stdin/stdout.

    Shared by the ``local`` and ``pyodide`` backends: readers, send, receive, interrupt and kill.
    A subclass starts the process, hands it to ``_attach`` and says why it died (``_death_reason``).

    The reader reads only while the host waits for something (``ready``, then from each ``execute``
    to its ``done``) and keeps at most ``READ_AHEAD_BYTES`` beyond one message: code can write to
    its end of the channel at any time (a background process, between executions too), and the
    host must not queue whatever it writes. Between executions its writes fill the pipe and block.
    """

    start_timeout_s = 10.0
    message_limit = MAX_MESSAGE_BYTES

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._cgroup: Any = None
        self._messages: queue.SimpleQueue[tuple[Any, int]] = queue.SimpleQueue()  # (message, line bytes)
        self._room = threading.Condition()
        self._queued = 0  # line bytes in ``_messages``
        self._listening = threading.Event()  # the host waits for a message: the reader may read
        self._listening.set()  # the ``ready`` message
        self._awaited: Any = None  # id of the execution whose ``done`` ends the wait
        self._stopped = False
        self._send_lock = threading.Lock()
        self._stderr_tail = b""
        self._reason: str | None = None

    def _attach(self, process: subprocess.Popen[bytes], *, wait: bool = True) -> None:
        """Read the new process's pipes and (``wait``) wait for its ``ready`` message."""
        self._process = process
        threading.Thread(target=self._read_stdout, args=(process.stdout,), daemon=True).start()
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
        if ready is None or ready.get("type") != "ready":
            self.kill()
            raise SessionClosed(f"did not become ready within {self.start_timeout_s:g} s (got {ready!r})")

    def _read_stdout(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: kill() closed the pipe
            try:
                for line in protocol_lines(stream, self.message_limit):  # bounded: code can write to this channel
                    try:
                        message = json.loads(line)
                    except ValueError:
                        self._put(ProtocolError(f"not a JSON message: {line[:200]!r}"), 0)
                        return
                    if not isinstance(message, dict):
                        self._put(ProtocolError(f"not a message: {line[:200]!r}"), 0)
                        return
                    if message.get("type") == "ready" or (
                        message.get("type") == "done" and message.get("id") == self._awaited
                    ):
                        self._listening.clear()  # before the host can see it and send the next execute
                    self._put(message, len(line))
                    self._listening.wait()
                    with self._room:
                        self._room.wait_for(lambda: self._queued < READ_AHEAD_BYTES or self._stopped)
                    if self._stopped:
                        return
            except ProtocolError as exc:
                self._put(exc, 0)
                return
        self._put(_EOF, 0)

    def _put(self, item: Any, size: int) -> None:
        with self._room:
            self._queued += size
        self._messages.put((item, size))

    def _read_stderr(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
                self._stderr_tail = (self._stderr_tail + chunk)[-16384:]

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        if message.get("type") == "execute":
            self._awaited = message.get("id")
            self._listening.set()
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
        try:
            item, size = self._messages.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._room:
            self._queued -= size
            self._room.notify_all()
        if item is _EOF:
            self._messages.put((_EOF, 0))
            raise SessionClosed(self._death_reason())
        if isinstance(item, ProtocolError):
            raise item
        return item

    def interrupt(self) -> None:
        with contextlib.suppress(SessionClosed):
            self.send({"type": "interrupt"})

    def kill(self) -> None:
        with self._room:  # let a waiting reader see the closed pipe and end
            self._stopped = True
            self._room.notify_all()
        self._listening.set()
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
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
