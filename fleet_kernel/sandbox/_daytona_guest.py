"""Fleet's runtime inside a Daytona code-interpreter context. Stdlib only: the host sends this source in.

Daytona's daemon runs each ``run_code`` on its REPL worker's main thread and streams that worker's
``sys.stdout`` to the host one frame per line. So each execute is one ``run_code`` that calls
``Guest.run(<execute request as JSON>)``: the shared ``Runtime`` from ``runtime.py`` runs the cell on
this main thread (so a SIGINT, from the daemon's timeout or from us, lands in the code), and every
protocol message goes back as a marker line on that stdout: ``\\x1e`` + ``M`` + JSON. A message longer
than ``PIECE`` characters is sent as ``P`` lines followed by one ``M`` line, which keeps every line far
under the daemon's 1 MiB line cap. The runtime's coalescer keeps the frame rate far under the
daemon's 256-frame queue.

Host-to-sandbox messages (tool replies, interrupts) cannot share the WebSocket, so the host uploads
them as files into ``inbox`` and a thread here polls it: every 2 ms while a tool call waits, 20 ms
while code runs, 100 ms when idle. Each file ends with ``REPLY_END``, so a half-written upload is
never read.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
from typing import Any

MARK = "\x1e"
PIECE = 60_000  # characters of ASCII JSON per marker line (at most ~2x that once the daemon escapes it)
REPLY_END = "\n\x1e\n"


class Guest:
    """Hosts one ``Runtime`` in the daemon's worker; built on its main thread by ``boot``."""

    def __init__(self, runtime_module: Any, inbox: str, max_output_bytes: int) -> None:
        os.makedirs(inbox, mode=0o700, exist_ok=True)
        self._inbox = inbox
        self._lock = threading.Lock()
        self._stream: Any = None  # the daemon's stdout of the execution in progress, else None
        self._done = threading.Event()
        self._awaiting = 0  # tool calls sent and not answered yet
        self._wake = threading.Event()  # cuts the poller's sleep short when a tool call goes out
        self._main = threading.main_thread().ident or 0
        self.types = runtime_module.MessageType  # the protocol's message types, defined by the runtime
        saved = sys.stdout, sys.stderr
        self.runtime = runtime_module.Runtime(
            self._send, None, max_output_bytes=max_output_bytes, threaded=True, capture_fds=False, reap=False
        )
        self._out, self._err = sys.stdout, sys.stderr  # the runtime's coalescing streams
        sys.stdout, sys.stderr = saved
        signal.signal(signal.SIGINT, self._on_sigint)
        threading.Thread(target=self._poll, name="fleet-inbox", daemon=True).start()

    # -- sandbox to host ---------------------------------------------------------------------------

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        if self.runtime.interruptible:  # only inside model code, never while we write a message
            raise KeyboardInterrupt

    def _send(self, message: dict[str, Any]) -> None:
        """The runtime's send, called on its one sender thread."""
        if message.get("type") == self.types.TOOL_CALL:
            with self._lock:
                self._awaiting += 1
        self.write(message)
        if message.get("type") == self.types.TOOL_CALL:
            self._wake.set()

    def write(self, message: dict[str, Any]) -> None:
        text = json.dumps(message, default=str)
        with self._lock:
            stream = self._stream
            if stream is None:
                return  # between executions nobody listens (the daemon drops such output too)
            for start in range(0, len(text), PIECE):
                kind = "M" if start + PIECE >= len(text) else "P"
                stream.write(f"{MARK}{kind}{text[start : start + PIECE]}\n")
            stream.flush()
            if message.get("type") == self.types.DONE:
                self._done.set()

    # -- one execution per run_code ------------------------------------------------------------------

    def attach(self) -> None:
        with self._lock:
            self._stream = sys.stdout
            self._done.clear()

    def detach(self) -> None:
        with self._lock:
            self._stream = None

    def run(self, raw: str) -> None:
        """Run one ``execute`` request; returns after its ``done`` line is written."""
        request = json.loads(raw)
        self.attach()
        saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout, sys.stderr = self._out, self._err
        sys.stdin = io.StringIO("")  # the worker's real stdin carries the daemon's commands
        self.runtime.running = request.get("id")
        finished = False
        try:
            self.runtime.execute(request)
            finished = True
        finally:
            self.runtime.running = None
            sys.stdout, sys.stderr, sys.stdin = saved
            if finished:
                self._done.wait(30)  # the sender thread writes ``done`` last
            self.detach()

    # -- host to sandbox ---------------------------------------------------------------------------

    def _poll(self) -> None:
        while True:
            try:
                names = sorted(n for n in os.listdir(self._inbox) if n.endswith(".msg"))
            except FileNotFoundError:
                os.makedirs(self._inbox, mode=0o700, exist_ok=True)
                names = []
            for name in names:
                path = os.path.join(self._inbox, name)
                try:
                    with open(path, encoding="utf-8") as handle:
                        data = handle.read()
                except OSError:
                    continue
                if not data.endswith(REPLY_END):
                    continue  # still being written
                os.unlink(path)
                try:
                    self._dispatch(json.loads(data[: -len(REPLY_END)]))
                except ValueError:
                    continue
            self._wake.wait(0.002 if self._awaiting else 0.02 if self.runtime.running is not None else 0.1)
            self._wake.clear()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in (self.types.TOOL_RESULT, self.types.TOOL_ERROR):
            with self._lock:
                self._awaiting = max(0, self._awaiting - 1)
            self.runtime.deliver(message)
        elif kind == self.types.INTERRUPT:
            running = self.runtime.running
            if running is not None and message.get("id") in (None, running):
                signal.pthread_kill(self._main, signal.SIGINT)


def boot(inbox: str, max_output_bytes: int) -> Guest:
    """Called once per context by the host's preamble, on the worker's main thread; says ``ready``."""
    guest = Guest(sys.modules["fleet_sandbox_runtime"], inbox, max_output_bytes)
    guest.attach()
    try:
        guest.write({"type": guest.types.READY, "pid": os.getpid(), "python": sys.version.split()[0]})
    finally:
        guest.detach()
    return guest
