"""Host side of every sandbox backend: dspy's ``CodeInterpreter`` over a ``SandboxSession``.

A backend only supplies sessions (a process, a Pyodide worker, a remote sandbox) that carry the
``runtime.py`` protocol. This module turns that into what ``dspy.RLM`` needs: lazy start, one step's
execution (the messages relayed until ``done``, a stop when the turn is cancelled or the code runs too
long), and failures sorted by who can fix them: code errors, timeouts and crashed workers are
``CodeExecutionError`` (the model reads them and goes on; a crashed worker is restarted), only a broken
protocol is terminal (``SandboxCrashed``). What crosses into the sandbox is ``_values``'s, host tool
calls ``_tool_calls``'s, the output shown while code runs ``_output``'s; ``factory`` makes interpreters.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError, FinalOutput
from dspy.utils.callback import BaseCallback
from dspy.utils.callback import with_callbacks as _with_callbacks

from fleet_kernel.cancel import CancelToken
from fleet_kernel.errors import TurnCancelled
from fleet_kernel.sandbox._hints import hint
from fleet_kernel.sandbox._output import Output
from fleet_kernel.sandbox._protocol import ProtocolError, SandboxSession, SessionClosed
from fleet_kernel.sandbox._tool_calls import ToolCalls, by_name
from fleet_kernel.sandbox._values import HeldVariables
from fleet_kernel.sandbox.base import SandboxCrashed, current_observer
from fleet_kernel.sandbox.runtime import DoneKind, Execute, MessageType
from fleet_kernel.telemetry import metrics

_call_ids = itertools.count(1)

INTERRUPT_GRACE_S = 2.0  # after an interrupt, how long the code may take to stop before the worker is killed
POLL_S = 0.1  # how often a waiting execute looks at the cancel token and the clock
_STATE_LOST = "variables, imports and functions from earlier steps are gone (files in /workspace are kept)"


class Stop(enum.Enum):
    """Why the host asked running code to stop (at most one reason per execution, the first found)."""

    CANCEL = "cancel"  # the turn's cancel token was cancelled
    FATAL = "fatal"  # a host tool was stopped by a BaseException (a cancellation) that must reach the caller
    TIMEOUT = "timeout"  # the code ran past the execution timeout


F = TypeVar("F", bound=Callable[..., Any])


def with_callbacks(method: F) -> F:
    """dspy's ``with_callbacks`` (untyped), keeping the method's signature for the type checker."""
    return cast(F, _with_callbacks(method))


class SandboxInterpreter:
    """``dspy``'s ``CodeInterpreter`` on a sandbox session that is started lazily and restarted after a crash."""

    def __init__(
        self,
        new_session: Callable[[], SandboxSession],
        *,
        exec_timeout_s: float,
        cancel: CancelToken,
        tools: dict[str, Callable[..., Any]] | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        on_shutdown: Callable[[SandboxInterpreter], None] | None = None,
        max_output_bytes: int | None = None,
        backend: str = "unknown",
    ) -> None:
        self._new_session = new_session
        self._backend = backend
        self._exec_timeout_s = exec_timeout_s
        self._max_output = max_output_bytes  # characters passed on per execution, like the runtime's cap
        self._cancel = cancel
        self._tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields = output_fields
        self._tools_registered = False
        self.callbacks: list[BaseCallback] = []
        self.watcher: BaseCallback | None = None  # told of each execute directly (see ``execute``)
        self._on_shutdown = on_shutdown
        self._session: SandboxSession | None = None
        self._starting: SandboxSession | None = None  # a session still starting (booting, adopting, queued)
        self._held = HeldVariables()  # what the running sandbox holds
        self._busy = threading.Lock()
        self._ids = itertools.count(1)
        self._fatal: BaseException | None = None  # a tool was cancelled: stop the code, re-raise this
        self._crashed: str | None = None
        self._closed = False

    @property
    def tools(self) -> dict[str, Callable[..., Any]]:
        return self._tools

    # -- lifecycle ---------------------------------------------------------------------------------

    @with_callbacks
    def start(self) -> None:
        """Start the sandbox if it is not running (idempotent; also restarts one that died)."""
        if self._closed:
            raise CodeInterpreterError("This sandbox interpreter has been shut down.")
        if self._crashed:
            raise SandboxCrashed(self._crashed)
        if self._session is not None:
            return
        session = self._new_session()
        began = time.perf_counter()
        self._starting = session  # before the check: a cancel now either sees it (and kills it) or is seen
        try:
            self._cancel.raise_if_cancelled()
            session.start()
        except SessionClosed as exc:
            session.kill()
            if self._cancel.cancelled:  # killed by the cancel while it started
                raise self._cancelled() from exc
            raise SandboxCrashed(f"The sandbox could not start: {exc}") from exc
        except TurnCancelled:
            session.kill()
            raise
        finally:
            self._starting = None
        metrics.observe_sandbox_start(self._backend, time.perf_counter() - began)
        self._session = session
        self._held.clear()

    @with_callbacks
    def shutdown(self) -> None:
        """Kill the sandbox; this interpreter cannot be used again."""
        if self._closed:
            return
        self._closed = True
        self._drop_session()
        if self._on_shutdown is not None:
            self._on_shutdown(self)

    def interrupt(self) -> None:
        """Ask running code to stop now (called from another thread); the token decides what happens next.

        A sandbox still starting for a cancelled turn is stopped at once: waiting for it (a boot, a copy-in,
        a free slot) would only hold the turn's end back.
        """
        starting = self._starting
        if starting is not None and self._cancel.cancelled:
            starting.kill()
            return
        session = self._session
        if session is not None and self._busy.locked():
            session.interrupt()

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        self._held.clear()
        if session is not None:
            session.kill()

    # -- execution ---------------------------------------------------------------------------------

    @with_callbacks
    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """Run ``code`` with ``variables``; returns ``FinalOutput`` on SUBMIT, else the output text or None.

        ``watcher`` (the engine's observer) hears of it as a dspy callback would, without dspy's
        callback wrapper and its per-call cost.

        Raises:
            TurnCancelled: the turn was cancelled (before or while the code ran).
            SyntaxError: the code does not parse.
            CodeExecutionError: the code failed, timed out, or crashed the sandbox (which restarts).
            SandboxCrashed: the sandbox broke protocol or cannot start; terminal.
        """
        watcher = self.watcher
        if watcher is None:
            return self._execute(code, variables)
        call_id = f"execute-{next(_call_ids)}"  # unique in the process: a child's interpreter runs inside this one
        watcher.on_interpreter_execute_start(call_id, self, {"code": code, "variables": variables})
        try:
            result = self._execute(code, variables)
        except BaseException as exc:
            watcher.on_interpreter_execute_end(call_id, None, exc)
            raise
        watcher.on_interpreter_execute_end(call_id, result, None)
        return result

    def _execute(self, code: str, variables: dict[str, Any] | None) -> Any:
        self._cancel.raise_if_cancelled()
        if not self._busy.acquire(blocking=False):
            raise CodeInterpreterError("This sandbox is already running code.")
        try:
            session = self._session
            if session is None:
                self.start()  # through dspy's callbacks, as a start of RLM's own
                session = self._session
                if session is None:  # shut down from another thread (the factory closed) while it started
                    raise CodeInterpreterError("The sandbox was shut down while it started.")
            exec_id = next(self._ids)
            request: Execute = {
                "type": MessageType.EXECUTE,
                "id": exec_id,
                "code": code,
                "tools": sorted(self._tools),
                "output_fields": self.output_fields,
                "variables": self._held.changed(variables or {}, self._tools),
            }
            try:
                session.send(request)
            except SessionClosed as exc:
                self._drop_session()
                raise CodeExecutionError(f"The sandbox process {exc}; it was restarted and {_STATE_LOST}.") from exc
            finished = False
            try:
                result = self._pump(session, exec_id)
                finished = True
                return result
            except CodeExecutionError as exc:
                finished = True
                added = hint(str(exc), code, [*self._tools, "SUBMIT"])
                if added:
                    raise CodeExecutionError(f"{exc}{added}") from exc.__cause__
                raise
            except SyntaxError:
                finished = True
                raise
            finally:
                if not finished:  # cancelled or broken while the code still runs: its state is of no use
                    self._drop_session()
        finally:
            self._busy.release()

    def _pump(self, session: SandboxSession, exec_id: int) -> Any:
        """Relay messages on the calling thread until ``done``: output to the observer, tool calls to threads."""
        output = Output(current_observer(), self._max_output)
        calls = ToolCalls(session, self.invoke_tool, self._set_fatal)
        stop: Stop | None = None  # set once we asked the code to stop
        stopped_at = last_interrupt = 0.0
        used, last = 0.0, time.monotonic()
        while True:
            now = time.monotonic()
            if calls.running == 0:  # time spent in host tools (LM calls) is not the code's
                used += now - last
            last = now
            if stop is None:
                stop = self._stop_reason() or (Stop.TIMEOUT if used >= self._exec_timeout_s else None)
                if stop:
                    session.interrupt()
                    stopped_at = last_interrupt = now
            elif now - stopped_at > INTERRUPT_GRACE_S:
                self._drop_session()
                raise self._stop_error(stop, output.text(), None)
            elif now - last_interrupt > 0.5:  # code may have swallowed one KeyboardInterrupt
                session.interrupt()
                last_interrupt = now
            try:
                message = session.receive(POLL_S)
            except SessionClosed as exc:
                self._drop_session()
                if self._closed:
                    raise CodeInterpreterError("The sandbox was shut down while code was running.") from exc
                if stop in (Stop.CANCEL, Stop.FATAL):
                    raise self._stop_error(stop, "", None) from exc
                raise CodeExecutionError(
                    f"{output.text()}\nThe sandbox process {exc}. It was restarted: {_STATE_LOST}.".lstrip()
                ) from exc
            except ProtocolError as exc:
                self._crashed = f"The sandbox broke protocol: {exc}"
                self._drop_session()
                raise SandboxCrashed(self._crashed) from exc
            if message is None:
                continue
            kind = message.get("type")
            if kind == MessageType.OUT:
                output.show(message.get("stream"), message.get("text"))
            elif kind == MessageType.TOOL_CALL:
                calls.start(message)
            elif kind == MessageType.DONE and message.get("id") == exec_id:
                return self._finish(message, stop, output)

    def _finish(self, done: dict[str, Any], stop: Stop | None, output: Output) -> Any:
        """The execution's outcome from its ``done``: the output it still carries is shown first; when the code
        was asked to stop, the stop's error."""
        tail = done.get("tail")
        for chunk in tail if isinstance(tail, list) else ():  # written by the sandbox: checked
            if isinstance(chunk, list) and len(chunk) == 2:
                output.show(*chunk)
        if stop is None:  # factory.interrupt() or a cancelled tool got there before the loop looked
            stop = self._stop_reason()
        if stop and not (stop is Stop.TIMEOUT and done.get("kind") != DoneKind.INTERRUPTED):
            raise self._stop_error(stop, done.get("output") or "", done.get("error"))
        return self._result(done)

    def _set_fatal(self, exc: BaseException) -> None:
        """A host tool was stopped by ``exc`` (a cancellation): the code is stopped and ``exc`` re-raised."""
        self._fatal = exc

    def _stop_reason(self) -> Stop | None:
        """Why the code must stop now, short of the timeout: a cancelled turn, or a host tool's fatal error."""
        return Stop.CANCEL if self._cancel.cancelled else Stop.FATAL if self._fatal else None

    def _stop_error(self, stop: Stop, output: str, error: dict[str, Any] | None) -> BaseException:
        if stop is Stop.CANCEL:
            return self._cancelled()
        if stop is Stop.FATAL:
            fatal, self._fatal = self._fatal, None
            return fatal or self._cancelled()
        limit = f"{self._exec_timeout_s:g} s"
        if error is None:
            message = (
                f"{output}\nExecution timed out after {limit} and did not stop when "
                f"interrupted, so the sandbox was restarted: {_STATE_LOST}.".lstrip()
            )
        else:
            message = (
                f"{output}\n{error.get('traceback', '')}Execution timed out after {limit} and "
                "was interrupted; the REPL state is kept. Do less per step, or work in "
                "smaller pieces.".lstrip()
            )
        timed_out: BaseException = CodeExecutionError(message)
        return timed_out

    def _cancelled(self) -> TurnCancelled:
        return self._cancel.error() or TurnCancelled()

    @staticmethod
    def _result(done: dict[str, Any]) -> Any:
        kind, output, value = done.get("kind"), done.get("output") or "", done.get("value")
        error = done.get("error") or {}
        if kind == DoneKind.FINAL:
            return FinalOutput(value)
        if kind == DoneKind.SYNTAX:
            raise SyntaxError(error.get("traceback") or error.get("message") or "invalid syntax")
        if kind in (DoneKind.ERROR, DoneKind.INTERRUPTED):
            text = f"{output}{error.get('traceback') or error.get('message', '')}".rstrip("\n")
            raise CodeExecutionError(text)
        if value is not None:
            output = f"{output}{'' if not output or output.endswith(chr(10)) else chr(10)}{value}"
        return output.rstrip("\n") or None

    # -- host tools --------------------------------------------------------------------------------

    @with_callbacks
    def invoke_tool(self, tool_name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run one host tool for sandboxed code; awaits coroutines of async tools."""
        tool = self._tools.get(tool_name)
        if tool is None:
            raise NameError(f"{tool_name!r} is not a tool of this sandbox")
        if args:
            args, kwargs = by_name(tool, args, kwargs)
        result = tool(*args, **kwargs)
        if inspect.isawaitable(result):

            async def wait() -> Any:
                return await result

            result = asyncio.run(wait())
        return result
