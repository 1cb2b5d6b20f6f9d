"""The interpreter factory a backend opens for a turn: ``dspy.RLM`` calls it for each interpreter it needs.

It can interrupt every interpreter it made (through the turn's ``CancelToken``) and close them all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dspy.primitives.code_interpreter import CodeInterpreterError

from fleet_kernel.cancel import CancelToken
from fleet_kernel.sandbox._protocol import SandboxSession
from fleet_kernel.sandbox.interpreter import SandboxInterpreter


class SandboxFactory:
    """A zero-argument interpreter factory for ``dspy.RLM`` that can interrupt and close what it made.

    ``cancel`` is the turn's token: once it is cancelled, running code is interrupted and every
    ``execute`` raises its ``TurnCancelled``.
    """

    def __init__(
        self,
        new_session: Callable[[], SandboxSession],
        *,
        backend: str,
        execution_instructions: str,
        exec_timeout_s: float,
        cancel: CancelToken | None = None,
        on_close: Callable[[], None] | None = None,
        max_output_bytes: int | None = None,
    ) -> None:
        self.backend = backend
        self.execution_instructions = execution_instructions
        self.cancel = cancel if cancel is not None else CancelToken()
        self._new_session = new_session
        self._exec_timeout_s = exec_timeout_s
        self._max_output_bytes = max_output_bytes
        self._on_close = on_close
        self._interpreters: set[SandboxInterpreter] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.cancel.on_cancel(self._interrupt_all)

    def __call__(self) -> SandboxInterpreter:
        interpreter = SandboxInterpreter(
            self._new_session,
            exec_timeout_s=self._exec_timeout_s,
            cancel=self.cancel,
            on_shutdown=self._forget,
            max_output_bytes=self._max_output_bytes,
            backend=self.backend,
        )
        with self._lock:
            if self._closed:
                raise CodeInterpreterError(f"The {self.backend} sandbox has been closed.")
            self._interpreters.add(interpreter)
        return interpreter

    def interrupt(self, reason: str = "cancelled") -> None:
        """Cancel the token: stop running code in every interpreter; later ``execute`` calls raise ``TurnCancelled``."""
        self.cancel.cancel(reason)

    def _interrupt_all(self) -> None:
        with self._lock:
            interpreters = list(self._interpreters)
        for interpreter in interpreters:
            interpreter.interrupt()

    def close(self) -> None:
        """Shut down every interpreter made here and release the backend's resources."""
        with self._lock:
            self._closed = True
            interpreters = list(self._interpreters)
        for interpreter in interpreters:
            interpreter.shutdown()
        if self._on_close is not None:
            self._on_close()

    @property
    def interpreters(self) -> list[SandboxInterpreter]:
        with self._lock:
            return list(self._interpreters)

    def _forget(self, interpreter: SandboxInterpreter) -> None:
        with self._lock:
            self._interpreters.discard(interpreter)
