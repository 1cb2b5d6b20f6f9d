"""How a sandbox reports back while code runs (the backend contract itself is ``contract.py``).

A backend opens an ``InterpreterFactory``: a zero-argument callable that ``dspy.RLM`` calls for each
interpreter it needs (the root and every child RLM), carrying ``execution_instructions`` for the
prompt, plus ``interrupt()`` (cancel whatever runs now) and ``close()`` (release per-session resources).

While ``execute`` runs, the interpreter reports to the ``SandboxObserver`` found in the
``observer`` context variable of the calling thread: output chunks as they are printed, and each
host tool call. The engine sets that variable; backends copy the context into their tool threads.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, Protocol

from dspy.primitives.code_interpreter import CodeInterpreterError

from fleet_kernel.sandbox.contract import InterpreterFactory

__all__ = [
    "InterpreterFactory",
    "SandboxCrashed",
    "SandboxObserver",
    "current_observer",
    "observer",
    "run_with_context",
]


class SandboxObserver(Protocol):
    """Receives what happens inside ``execute``; called on the thread that runs the tool or execute."""

    def on_output(self, stream: str, text: str) -> None:
        """A chunk of ``stdout``/``stderr`` printed by the running code (already coalesced)."""

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """A host tool is about to run; returns a call id for ``on_tool_end``."""

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        """The host tool returned ``result`` (or raised it, when ``ok`` is false)."""

    def tool_scope(self) -> AbstractContextManager[Any]:
        """Optional: the context every host tool runs in (dspy's bridge tools too, which are not reported)."""


observer: ContextVar[SandboxObserver | None] = ContextVar("fleet_sandbox_observer", default=None)


def current_observer() -> SandboxObserver | None:
    return observer.get()


def run_with_context(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """Bind ``func`` to a copy of the current context, for a tool thread."""
    ctx = contextvars.copy_context()
    return lambda: ctx.run(func, *args, **kwargs)


class SandboxCrashed(CodeInterpreterError):
    """The sandbox process died or broke protocol: terminal for this interpreter (ends the turn)."""
