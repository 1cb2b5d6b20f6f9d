"""One interpreter's ``SandboxSession`` on Daytona: a code-interpreter context running ``runtime.py``.

``start`` creates the context and runs a preamble carrying the sources of ``runtime.py`` and
``_daytona_guest.py``; each ``execute`` message becomes one ``run_code`` on a thread of its own,
whose ``on_stdout`` frames are parsed back into protocol messages for ``receive``. Tool replies and
interrupts are uploaded into the guest's inbox. ``run_code`` is never retried: when it fails before
``done`` the outcome is unknown, so the session reports itself closed and the interpreter starts a
fresh context. Every other call here is idempotent and retried (``DaytonaBox.retry``).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daytona import DaytonaConnectionError, DaytonaError, DaytonaTimeoutError

from fleet_kernel.sandbox import _daytona_guest as guest
from fleet_kernel.sandbox._protocol import ProtocolError, SessionClosed
from fleet_kernel.sandbox.runtime import HostMessage, Interrupt, MessageType

if TYPE_CHECKING:
    from fleet_kernel.sandbox._daytona_box import DaytonaBox

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent
RUNTIME_SOURCE = (_HERE / "runtime.py").read_text(encoding="utf-8")
GUEST_SOURCE = (_HERE / "_daytona_guest.py").read_text(encoding="utf-8")
START_TIMEOUT_S = 60


def preamble(inbox: str, max_output_bytes: int) -> str:
    """Code for a new context: load the runtime and the guest as modules, boot the guest."""
    return (
        "import sys as _fleet_sys, types as _fleet_types\n"
        "def _fleet_load(name, source):\n"
        "    module = _fleet_types.ModuleType(name)\n"
        "    module.__file__ = '<' + name + '>'\n"
        "    _fleet_sys.modules[name] = module\n"
        "    exec(compile(source, module.__file__, 'exec'), module.__dict__)\n"
        "    return module\n"
        f"_fleet_load('fleet_sandbox_runtime', {RUNTIME_SOURCE!r})\n"
        f"__fleet_guest = _fleet_load('fleet_daytona_guest', {GUEST_SOURCE!r}).boot({inbox!r}, {max_output_bytes})\n"
    )


class MarkerParser:
    """Turns ``on_stdout`` text back into protocol messages; other lines are passed on as output."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self._emit = emit
        self._partial = ""
        self._pieces: list[str] = []
        self.seen_done = False
        self.error: ProtocolError | None = None  # set instead of raised: the SDK's receive loop calls us

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)

    def feed_stderr(self, text: str) -> None:
        self._emit({"type": MessageType.OUT, "stream": "stderr", "text": text})

    def flush(self) -> None:
        if self._partial:
            self._emit({"type": MessageType.OUT, "stream": "stdout", "text": self._partial})
            self._partial = ""

    def _line(self, line: str) -> None:
        if self.error is not None:
            return
        if not line.startswith(guest.MARK) or len(line) < 2:
            self._emit({"type": MessageType.OUT, "stream": "stdout", "text": line + "\n"})
            return
        kind, payload = line[1], line[2:]
        if kind == "P":
            self._pieces.append(payload)
            return
        text, self._pieces = "".join(self._pieces) + payload, []
        try:
            message = json.loads(text)
        except ValueError:
            self.error = ProtocolError(f"unreadable message from the Daytona sandbox: {text[:200]!r}")
            return
        if message.get("type") == MessageType.DONE:
            self.seen_done = True
        self._emit(message)


class DaytonaSession:
    """A fresh code-interpreter context in the session's sandbox, for one interpreter."""

    def __init__(self, box: DaytonaBox, *, max_output_bytes: int, run_timeout_s: int) -> None:
        self._box = box
        self._max_output_bytes = max_output_bytes
        self._run_timeout_s = run_timeout_s  # Daytona's own deadline per run_code: a backstop only
        self._inbox = f"/tmp/fleet-{secrets.token_hex(8)}"  # noqa: S108 - inside the Daytona sandbox, with a random name
        self._messages: queue.SimpleQueue[dict[str, Any] | Exception] = queue.SimpleQueue()
        self._seq = itertools.count(1)
        self._context: Any = None
        self._current: Any = None  # id of the execution in progress
        self._closed = False

    # -- SandboxSession ------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._context = self._box.retry(
                "create a code-interpreter context",
                lambda: self._box.sandbox.code_interpreter.create_context(cwd="/workspace"),
            )
        except DaytonaError as exc:
            raise SessionClosed(f"could not create a Daytona interpreter context: {self._box.explain(exc)}") from exc
        self._run(preamble(self._inbox, self._max_output_bytes), START_TIMEOUT_S, expect_done=False)
        try:
            ready = self._messages.get(timeout=1)
        except queue.Empty:
            ready = SessionClosed("the Daytona interpreter context did not start Fleet's runtime")
        if isinstance(ready, Exception):
            raise SessionClosed(str(ready)) from ready
        if ready.get("type") != MessageType.READY:
            raise SessionClosed(f"unexpected first message from the Daytona sandbox: {ready!r:.200}")

    def send(self, message: HostMessage) -> None:
        if self._closed:
            raise SessionClosed("was shut down")
        if message.get("type") == MessageType.EXECUTE:
            self._current = message.get("id")
            code = f"__fleet_guest.run({json.dumps(message)!r})"
            threading.Thread(
                target=self._run, args=(code, self._run_timeout_s), daemon=True, name="fleet-daytona-run"
            ).start()
        else:
            self._post(message)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        try:
            item = self._messages.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def interrupt(self) -> None:
        message: Interrupt = {"type": MessageType.INTERRUPT, "id": self._current}
        threading.Thread(target=self._post_quietly, args=(message,), daemon=True, name="fleet-daytona-int").start()

    def kill(self) -> None:
        if self._closed:
            return
        self._closed = True
        context, self._context = self._context, None
        if context is not None:
            self._box.background(
                "delete an interpreter context", lambda: self._box.sandbox.code_interpreter.delete_context(context)
            )

    # -- transport ---------------------------------------------------------------------------------

    def _run(self, code: str, timeout_s: int, expect_done: bool = True) -> None:
        """One ``run_code``; never retried. A failure before ``done`` closes the session."""
        parser = MarkerParser(self._messages.put)
        problem: Exception | None = None
        try:
            result = self._box.sandbox.code_interpreter.run_code(
                code,
                context=self._context,
                on_stdout=lambda m: parser.feed(m.output),
                on_stderr=lambda m: parser.feed_stderr(m.output),
                timeout=timeout_s,
            )
            parser.flush()
            if parser.error is not None:
                problem = parser.error
            elif result.error is not None:
                problem = ProtocolError(
                    f"Fleet's runtime failed in the Daytona sandbox: {result.error.name}: {result.error.value}"
                )
            elif expect_done and not parser.seen_done:
                problem = SessionClosed("ended the execution without an answer from Fleet's runtime")
        except DaytonaConnectionError as exc:  # before DaytonaTimeoutError: a connection timeout is both
            problem = SessionClosed(f"lost its connection to Daytona ({self._box.explain(exc)})")
        except DaytonaTimeoutError:
            problem = SessionClosed(f"ran past Daytona's {timeout_s} s limit for one run and was stopped")
        except DaytonaError as exc:
            problem = SessionClosed(f"failed in Daytona ({self._box.explain(exc)})")
        if problem is not None and not (expect_done and parser.seen_done) and not self._closed:
            self._messages.put(problem)

    def _post(self, message: HostMessage) -> None:
        """Upload one host-to-sandbox message into the guest's inbox (idempotent, so retried)."""
        data = (json.dumps(message) + guest.REPLY_END).encode()
        path = f"{self._inbox}/{next(self._seq):012d}.msg"
        try:
            self._box.retry("send a message to the sandbox", lambda: self._box.sandbox.fs.upload_file(data, path))
        except DaytonaError as exc:
            raise SessionClosed(f"could not reach the Daytona sandbox ({self._box.explain(exc)})") from exc

    def _post_quietly(self, message: HostMessage) -> None:
        try:
            self._post(message)
        except SessionClosed as exc:
            logger.warning("interrupting Daytona code failed: %s", exc)
