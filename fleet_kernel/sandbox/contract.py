"""The sandbox contract: what a backend implements, what every backend tells the model, and the registry.

A backend is one module with an object that has ``status``, ``instructions``, ``open`` and ``forget``
(see ``Backend``), named once in ``register`` (built-ins: ``_BUILTIN`` below). Front doors never look
at a backend themselves: they ask ``status(settings)`` which backend turns use and whether it can start,
``open_backend`` for an interpreter factory, and ``forget`` when a session is deleted. ``execute`` is the
interpreters' (``InterpreterFactory``). Stdlib only, so choosing a backend never imports dspy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.lazy import import_module
from fleet_kernel.workspace import ARTIFACTS_DIR, FILES_DIR, MEMORY_FILE

if TYPE_CHECKING:
    from dspy.primitives.code_interpreter import CodeInterpreter

    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.config import Settings

logger = logging.getLogger(__name__)

DEFAULT_ORDER = ("local", "pyodide")  # without FLEET_SANDBOX: the first that can start here, else the last


class InterpreterFactory(Protocol):
    """One per turn (or per session, reused warm): makes interpreters for ``dspy.RLM``."""

    execution_instructions: str

    def __call__(self) -> CodeInterpreter: ...

    def interrupt(self) -> None:
        """Stop every running execution now (turn cancelled); later ``execute`` calls raise ``TurnCancelled``."""

    def close(self) -> None:
        """Shut down every interpreter this factory made and release backend resources."""


class Backend(Protocol):
    """What a sandbox backend implements; one instance per registered name."""

    def status(self, settings: Settings) -> str | None:
        """None when this backend can start here; else what is missing and how to fix it. Cheap: no network."""

    def instructions(self, settings: Settings, workspace: Path) -> str:
        """The prompt's description of the environment: ``describe(...)`` with this backend's own lines."""

    def open(self, settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> InterpreterFactory:
        """An interpreter factory working in ``workspace``; raises ``SandboxUnavailableError`` with the fix."""

    def forget(self, settings: Settings, session_id: str) -> None:
        """The session is deleted: release what this backend keeps for it (no-op when it keeps nothing)."""


class Admission(Protocol):
    """What a backend set aside for one turn (``admit``); released when the turn ends."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class Status:
    """Which backend turns use and, when it cannot start here, why (``problem``)."""

    backend: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def detail(self) -> str:
        return self.backend if self.problem is None else f"{self.backend}: {self.problem}"


# name -> a Backend, or "module:attribute" naming one (imported on first use, so listing names is cheap)
_BUILTIN: dict[str, str] = {
    "local": "fleet_kernel.sandbox.local:LOCAL",
    "pyodide": "fleet_kernel.sandbox.pyodide:BACKEND",
    "daytona": "fleet_kernel.sandbox.daytona:BACKEND",
    "unsafe-local": "fleet_kernel.sandbox.local:UNSAFE_LOCAL",
}
_registry: dict[str, Backend | str] = dict(_BUILTIN)


def register(name: str, backend: Backend | str) -> None:
    """Make ``backend`` selectable as ``FLEET_SANDBOX=name`` (a ``"module:attribute"`` is imported lazily)."""
    _registry[name] = backend


def names() -> tuple[str, ...]:
    return tuple(_registry)


def get(name: str) -> Backend:
    """The backend registered as ``name``; raises ``SandboxUnavailableError`` naming the known ones."""
    entry = _registry.get(name)
    if entry is None:
        raise SandboxUnavailableError(f"Unknown sandbox {name!r}; use {', '.join(names())}.")
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        entry = _registry[name] = getattr(import_module(module), attribute)
    return entry


def choose(settings: Settings) -> str:
    """The configured backend, else the first of ``DEFAULT_ORDER`` that can start here (else the last)."""
    if settings.sandbox:
        return settings.sandbox
    return next((name for name in DEFAULT_ORDER[:-1] if get(name).status(settings) is None), DEFAULT_ORDER[-1])


def status(settings: Settings) -> Status:
    """Which backend turns use and whether it can start here (may start a short probe process: use a thread)."""
    name = choose(settings)
    return Status(name, get(name).status(settings))


def open_backend(settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> InterpreterFactory:
    return get(choose(settings)).open(settings, workspace, cancel=cancel)


def prepare(settings: Settings) -> None:
    """Let the backend turns use get ready before the first turn (local: fill its sandbox pool); never raises.

    Optional for a backend (a ``prepare(settings)`` method); may probe the backend: call it off the event loop.
    """
    try:
        hook = getattr(get(choose(settings)), "prepare", None)
        if hook is not None:
            hook(settings)
    except Exception:  # a turn reports a backend that cannot start; this is only a head start
        logger.exception("preparing the sandbox failed")


def admit(settings: Settings, workspace: Path) -> Admission | None:
    """Set aside what a turn in ``workspace`` needs before it is claimed (local: a slot under ``[sandbox]
    max_sandboxes``); None when the backend keeps no count. Optional for a backend (an ``admit`` method).

    Raises:
        SandboxBusyError: the machine runs as many sandboxes as it may; the message names the cap.
    """
    hook = getattr(get(choose(settings)), "admit", None)
    return hook(settings, workspace) if hook is not None else None


def forget(settings: Settings, session_id: str) -> None:
    """The session is deleted: the backend turns use drops what it keeps for it (Daytona: its sandbox)."""
    get(choose(settings)).forget(settings, session_id)


def describe(
    runtime: str, *, exec_timeout_s: float, root: str = "/workspace", memory_mb: int | None = None, notes: str = ""
) -> str:
    """The instructions every backend gives the model; ``runtime`` says what runs where, ``notes`` what differs."""
    memory = f" and use {memory_mb} MB of memory" if memory_mb else ""
    return " ".join(
        part
        for part in (
            f"{runtime}.",
            "State persists between steps: variables, imports and functions defined earlier are still there.",
            (
                f"The working directory is {root}: the user's uploaded files are in {root}/{FILES_DIR}, "
                f"save files for the user in {root}/{ARTIFACTS_DIR}, and {root}/{MEMORY_FILE} holds notes kept "
                "across the turns of this session (read it at the start, append what is worth remembering)."
            ),
            notes,
            (
                "Use print() to see results: you only see what is printed (long output is truncated) "
                "and the value of a final bare expression."
            ),
            (
                f"Each step may run at most {exec_timeout_s:g} s{memory}; a step that times out is interrupted "
                "but keeps its variables."
            ),
            "When done, call SUBMIT(...) with the output fields, positionally or by name.",
        )
        if part
    )
