"""Sandboxes for model-written code: pick a backend and get a ``dspy.RLM`` interpreter factory.

    factory = open_sandbox(settings, workspace, cancel=token)  # the turn's CancelToken
    rlm = dspy.RLM("question -> answer", interpreter_factory=factory)
    ...
    token.cancel(reason)  # or factory.interrupt(): running and later executes raise TurnCancelled
    factory.close()      # kill every worker the factory started

The contract (what a backend implements, the model's instructions, the registry) is ``contract``.
Backends: ``local`` (bubblewrap; the default where it works), ``pyodide``, ``daytona``, and
``unsafe-local`` (no isolation, explicit opt-in only).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_kernel.sandbox.contract import Status, choose, forget, status
from fleet_kernel.sandbox.contract import open_backend as _open_backend

if TYPE_CHECKING:
    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.config import Settings
    from fleet_kernel.sandbox._probe import probe_bwrap
    from fleet_kernel.sandbox.base import InterpreterFactory, SandboxCrashed, SandboxObserver, observer
    from fleet_kernel.sandbox.factory import SandboxFactory
    from fleet_kernel.sandbox.interpreter import SandboxInterpreter

# Imported on first use (dspy, the backends), so importing the package or choosing a backend stays cheap.
_LAZY = {
    "InterpreterFactory": "base",
    "SandboxCrashed": "base",
    "SandboxObserver": "base",
    "observer": "base",
    "SandboxFactory": "factory",
    "SandboxInterpreter": "interpreter",
    "probe_bwrap": "_probe",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"fleet_kernel.sandbox.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'fleet_kernel.sandbox' has no attribute {name!r}")


__all__ = [
    "InterpreterFactory",
    "SandboxCrashed",
    "SandboxFactory",
    "SandboxInterpreter",
    "SandboxObserver",
    "Status",
    "choose",
    "forget",
    "observer",
    "open_sandbox",
    "probe_bwrap",
    "status",
]


def open_sandbox(settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
    """An interpreter factory on the configured backend (``settings.sandbox``), working in ``workspace``.

    Raises:
        SandboxUnavailableError: the backend cannot run here; the message says what to install or set.
    """
    return _open_backend(settings, workspace, cancel=cancel)  # type: ignore[return-value]
