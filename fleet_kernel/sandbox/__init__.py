"""Sandboxes for model-written code: pick a backend and get a ``dspy.RLM`` interpreter factory.

    factory = open_sandbox(settings, workspace, cancel=token)  # the turn's CancelToken
    rlm = dspy.RLM("question -> answer", interpreter_factory=factory)
    ...
    token.cancel(reason)  # or factory.interrupt(): running and later executes raise TurnCancelled
    factory.close()      # kill every worker the factory started

Backends: ``local`` (bubblewrap; the default where it works), ``pyodide``, ``daytona``, and
``unsafe-local`` (no isolation, explicit opt-in only).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from pathlib import Path

from typing import TYPE_CHECKING, Any

from fleet_kernel.config import SandboxLimits, Settings
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox.local import ProcessSession, probe_bwrap

if TYPE_CHECKING:
    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.sandbox.base import InterpreterFactory, SandboxCrashed, SandboxObserver, observer
    from fleet_kernel.sandbox.interpreter import SandboxFactory, SandboxInterpreter

# Names that need dspy are imported on first use, so choosing a backend (the first event of a turn) is cheap.
_LAZY = {
    "InterpreterFactory": "base", "SandboxCrashed": "base", "SandboxObserver": "base", "observer": "base",
    "SandboxFactory": "interpreter", "SandboxInterpreter": "interpreter",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"fleet_kernel.sandbox.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'fleet_kernel.sandbox' has no attribute {name!r}")

__all__ = [
    "InterpreterFactory", "SandboxCrashed", "SandboxFactory", "SandboxInterpreter", "SandboxObserver",
    "default_backend", "observer", "open_sandbox", "probe_bwrap",
]

logger = logging.getLogger(__name__)
WORKSPACE_DIRS = ("files", "artifacts", "memory")
_NOTABLE_PACKAGES = ("numpy", "pandas", "scipy", "matplotlib", "sklearn", "sympy", "networkx", "bs4", "yaml")


def default_backend() -> str:
    """``local`` where bubblewrap works, else ``pyodide``."""
    return "local" if probe_bwrap() is None else "pyodide"


@functools.cache
def _installed_packages() -> str:
    found = [name for name in _NOTABLE_PACKAGES if importlib.util.find_spec(name) is not None]
    return f" Installed packages include {', '.join(found)}." if found else ""


def _instructions(root: str, exec_timeout_s: float, limits: SandboxLimits, *, isolated: bool) -> str:
    version = ".".join(map(str, sys.version_info[:2]))
    where = ("in an isolated sandbox with no network access" if isolated
             else "directly on the host machine (no sandbox)")
    return (
        f"Python {version} (CPython) runs {where}. State persists between steps: variables, imports and "
        f"functions defined earlier are still there. The working directory is {root}: the user's uploaded files "
        f"are in {root}/files, save files for the user in {root}/artifacts, and {root}/memory/MEMORIES.md holds "
        f"notes kept across sessions (read it at the start, append what is worth remembering). Nothing can be "
        f"installed.{_installed_packages()} Use print() to see results: you only see what is printed (long output "
        f"is truncated) and the value of a final bare expression. Each step may run at most {exec_timeout_s:g} s "
        f"and use {limits.memory_mb} MB of memory; a step that times out is interrupted but keeps its variables. "
        f"When done, call SUBMIT(...) with the output fields, positionally or by name."
    )


def open_sandbox(settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
    """An interpreter factory on the configured backend (``settings.sandbox``), working in ``workspace``.

    Raises:
        SandboxUnavailableError: the backend cannot run here; the message says what to install or set.
    """
    from fleet_kernel.sandbox.interpreter import SandboxFactory

    backend = settings.sandbox or default_backend()
    limits, exec_timeout_s = settings.policy.sandbox, settings.limits.exec_timeout_s
    if backend == "daytona":
        from fleet_kernel.sandbox.daytona import open_daytona

        return open_daytona(settings, workspace, cancel=cancel)
    if backend == "pyodide":
        from fleet_kernel.sandbox.pyodide import open_pyodide

        return open_pyodide(settings, workspace, cancel=cancel)
    if backend not in ("local", "unsafe-local"):
        raise SandboxUnavailableError(f"Unknown sandbox {backend!r}; use local, pyodide, daytona or unsafe-local.")
    isolated = backend == "local"
    if isolated and (reason := probe_bwrap()) is not None:
        raise SandboxUnavailableError(
            f"The local sandbox cannot run: {reason}; or set FLEET_SANDBOX=unsafe-local to run without isolation.")
    workspace = workspace.absolute()
    for name in WORKSPACE_DIRS:
        (workspace / name).mkdir(parents=True, exist_ok=True)
    if not isolated:
        logger.warning("FLEET_SANDBOX=unsafe-local: model-written code runs WITHOUT isolation, with your user's "
                       "files, network and credentials, in %s", workspace)
    root = "/workspace" if isolated else str(workspace)
    return SandboxFactory(
        functools.partial(ProcessSession, workspace, limits, isolated=isolated), backend=backend,
        execution_instructions=_instructions(root, exec_timeout_s, limits, isolated=isolated),
        exec_timeout_s=exec_timeout_s, cancel=cancel, max_output_bytes=limits.max_output_bytes)
