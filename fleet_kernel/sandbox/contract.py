"""The sandbox contract: what a backend implements, what every backend tells the model, and the registry.

A backend is one module with an object that has ``status``, ``instructions``, ``open`` and ``forget``
(see ``Backend``), named once in ``register`` (built-ins: ``fleet_kernel.sandbox_registry.BUILTIN``).
Front doors never look at a backend themselves: they ask ``status(settings)`` which backend turns use and
whether it can start, ``open_backend`` for an interpreter factory, and ``forget`` when a session is deleted.
``execute`` is the interpreters' (``InterpreterFactory``). Stdlib only, so choosing a backend never imports dspy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from fleet_kernel import sandbox_registry
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.lazy import import_module
from fleet_kernel.workspace import ARTIFACTS_DIR, FILES_DIR, MEMORY_FILE

if TYPE_CHECKING:
    from dspy.primitives.code_interpreter import CodeInterpreter

    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.config import Settings

logger = logging.getLogger(__name__)

DEFAULT_ORDER = ("local", "pyodide")  # without FLEET_SANDBOX: the first that can run here at all, else the last


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

    # Optional, for a backend of DEFAULT_ORDER: ``absent(settings) -> str | None``, why it cannot run on this
    # machine at all (not installed, not supported), so the default moves on; without it, ``status`` is used.


class Admission(Protocol):
    """What a backend set aside for one turn (``admit``); released when the turn ends."""

    def release(self) -> None: ...


@dataclass(frozen=True)
class Status:
    """Which backend turns use, when it cannot start here why (``problem``), and, when the default passed
    over a backend before it, why (``passed_over``)."""

    backend: str
    problem: str | None = None
    passed_over: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def detail(self) -> str:
        detail = self.backend if self.problem is None else f"{self.backend}: {self.problem}"
        return detail if self.passed_over is None else f"{detail} ({self.passed_over})"


def register(name: str, backend: Backend | str) -> None:
    """Make ``backend`` selectable as ``FLEET_SANDBOX=name`` (a ``"module:attribute"`` is imported lazily)."""
    sandbox_registry.entries[name] = backend


def names() -> tuple[str, ...]:
    return sandbox_registry.names()


def get(name: str) -> Backend:
    """The backend registered as ``name``; raises ``SandboxUnavailableError`` naming the known ones."""
    entry = sandbox_registry.entries.get(name)
    if entry is None:
        raise SandboxUnavailableError(f"Unknown sandbox {name!r}; use {', '.join(names())}.")
    if isinstance(entry, str):
        module, _, attribute = entry.partition(":")
        entry = sandbox_registry.entries[name] = getattr(import_module(module), attribute)
    return cast("Backend", entry)


def choose(settings: Settings) -> str:
    """The configured backend, else the first of ``DEFAULT_ORDER`` that can run here at all (else the last)."""
    return settings.sandbox or _default(settings)[0]


def _default(settings: Settings) -> tuple[str, str | None]:
    """The backend turns use when none is configured, and why the ones before it were passed over.

    Only a backend that cannot run on this machine at all is passed over (``absent``): one that is here but
    fails (a temp folder its sandbox cannot reach) stays the choice, so the user reads its own cause and
    the backend never changes behind the user's back.
    """
    passed = []
    for name in DEFAULT_ORDER[:-1]:
        backend = get(name)
        why = getattr(backend, "absent", backend.status)(settings)
        if why is None:
            return name, None
        passed.append(f"the {name} sandbox is not used: {why}")
    return DEFAULT_ORDER[-1], "; ".join(passed)


def status(settings: Settings) -> Status:
    """Which backend turns use and whether it can start here (may start a short probe process: use a thread)."""
    name, passed_over = (settings.sandbox, None) if settings.sandbox else _default(settings)
    return Status(name, get(name).status(settings), passed_over)


def open_backend(settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> InterpreterFactory:
    """The chosen backend's factory; when the default passed over a backend, the error (or the log) says why.

    Raises:
        SandboxUnavailableError: the backend cannot start; the message says why, and why the default is this one.
    """
    if settings.sandbox:
        return get(settings.sandbox).open(settings, workspace, cancel=cancel)
    name, passed_over = _default(settings)
    try:
        factory = get(name).open(settings, workspace, cancel=cancel)
    except SandboxUnavailableError as exc:
        if passed_over is None:
            raise
        raise SandboxUnavailableError(f"{exc.message} ({passed_over})") from exc
    if passed_over is not None and passed_over not in _told:
        _told.add(passed_over)
        logger.warning("turns use the %s sandbox: %s", name, passed_over)
    return factory


_told: set[str] = set()  # why the default passed over a backend, logged once per reason


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
    """The instructions every backend gives the model; ``runtime`` says what runs where, ``notes`` what differs.

    Only what dspy.RLM's own prompt does not already say (that state persists, to print, to SUBMIT): a small
    model reads every word of it on every step.
    """
    memory = f" and {memory_mb} MB" if memory_mb else ""
    return " ".join(
        part
        for part in (
            f"{runtime}.",
            (
                f"The working directory is {root}: attached files are in {FILES_DIR}/, save files for the user in "
                f"{ARTIFACTS_DIR}/, {MEMORY_FILE} holds this session's notes."
            ),
            notes,
            f"A step may use {exec_timeout_s:g} s{memory}.",
        )
        if part
    )
