"""``CancelToken``: why a turn stops, set once, and what must react when it does.

One token per turn, made by the runner and handed down to the turn's thread, its observer, its
sandbox and its LMs' budget. Whoever stops the turn calls ``cancel(reason)``: the kernel's interrupt
and the Stop button (through ``TurnRunner.cancel``), a durable cancellation the heartbeat reads from
the store, the deadline, a used-up budget, and the turn's own end. The first reason wins. Whatever
must react registers with ``on_cancel`` (interrupt the sandbox's code, close LM requests in flight,
wake the runner), and code on the turn's path asks ``raise_if_cancelled``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleet_kernel.errors import TurnCancelled

log = logging.getLogger(__name__)


class CancelToken:
    """A one-way switch with a reason; thread-safe, and safe to set from a signal handler.

    The lock is reentrant because a SIGINT handler (the kernel's) may cancel while its own thread is
    inside the token. Callbacks run outside it, on the thread that cancels, each exactly once.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._set = threading.Event()
        self._cause: TurnCancelled | None = None
        self._callbacks: list[Callable[[], object]] = []

    def cancel(self, reason: str = "cancelled", kind: type[TurnCancelled] = TurnCancelled) -> bool:
        """Stop the turn for ``reason``; ``kind`` says how it ends (``BudgetExceeded``, ``TurnDeadlineExceeded``).

        Returns:
            True if this call cancelled the token, false if it was cancelled already (the first
            reason stays).
        """
        return self._settle(reason, kind)[0]

    def cancelled_with(self, reason: str, kind: type[TurnCancelled] = TurnCancelled) -> TurnCancelled:
        """``cancel(reason, kind)``, then the exception the turn stops with: this one's, or the first reason's
        when it was cancelled already."""
        cause = self._settle(reason, kind)[1]
        return type(cause)(cause.reason)

    def _settle(self, reason: str, kind: type[TurnCancelled]) -> tuple[bool, TurnCancelled]:
        with self._lock:
            if self._cause is not None:
                return False, self._cause
            cause = self._cause = kind(reason)
            callbacks, self._callbacks = self._callbacks, []
            self._set.set()
        for callback in callbacks:
            self._run(callback)
        return True, cause

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once when the token is cancelled; at once if it already is."""
        with self._lock:
            if self._cause is None:
                self._callbacks.append(callback)
                return
        self._run(callback)

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    @property
    def reason(self) -> str | None:
        cause = self._cause
        return cause.reason if cause is not None else None

    def error(self) -> TurnCancelled | None:
        """The exception the turn stops with, or ``None``: a new one per call, so threads never share a traceback."""
        cause = self._cause
        return type(cause)(cause.reason) if cause is not None else None

    def raise_if_cancelled(self) -> None:
        """Raise ``TurnCancelled`` (or the ``kind`` given to ``cancel``) once the token is cancelled."""
        error = self.error()
        if error is not None:
            raise error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds passed; returns whether it is cancelled."""
        return self._set.wait(timeout)

    @staticmethod
    def _run(callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception:  # noqa: BLE001 - one failing reaction must not keep the others from running
            log.exception("a cancel callback failed")
