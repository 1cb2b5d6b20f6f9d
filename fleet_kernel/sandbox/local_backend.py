"""The ``local`` and ``unsafe-local`` backends: processes of ``local.py``, ready ones from ``pool.py``.

Above both modules (the pool starts ``local``'s processes; the backends use the two), so no import runs
back. The bubblewrap probe is ``_probe``'s, where its one result per process is kept.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_kernel.config import Settings
from fleet_kernel.errors import SandboxBusyError, SandboxUnavailableError
from fleet_kernel.sandbox import _probe, _slots, local, pool
from fleet_kernel.sandbox.contract import describe
from fleet_kernel.workspace import Workspace

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.sandbox._protocol import SandboxSession
    from fleet_kernel.sandbox.factory import SandboxFactory

logger = logging.getLogger(__name__)

ADMIT_WAIT_S = 3.0  # a turn waits this long for a slot when it starts, then is refused (503)
_NOTABLE_PACKAGES = ("numpy", "pandas", "scipy", "matplotlib", "sklearn", "sympy", "networkx", "bs4", "yaml")


@functools.cache
def _installed_packages(extra: tuple[str, ...] = ()) -> str:
    """The data stack model code reaches for, and ``[sandbox] packages``, as far as they can be imported here
    (the local sandbox runs the host's Python); a named package that cannot is logged, not promised."""
    names = list(dict.fromkeys([*_NOTABLE_PACKAGES, *extra]))
    found = [name for name in names if importlib.util.find_spec(name) is not None]
    missing = [name for name in extra if name not in found]
    if missing:
        logger.warning("[sandbox] packages: %s cannot be imported here; the model is not told of them", missing)
    return f" Installed packages include {', '.join(found)}." if found else ""


class LocalBackend:
    """``local`` (``isolated``: under bubblewrap) or ``unsafe-local`` (a plain subprocess of the host user)."""

    def __init__(self, *, isolated: bool) -> None:
        self.isolated = isolated

    def status(self, settings: Settings) -> str | None:  # noqa: ARG002 - the backend contract's signature
        return _probe.probe_bwrap() if self.isolated else None

    def absent(self, settings: Settings) -> str | None:
        """Why bubblewrap cannot run here at all (the default backend then moves on); None otherwise."""
        reason = self.status(settings)
        return reason if reason is not None and _probe.cannot_run_here(reason) else None

    def instructions(self, settings: Settings, workspace: Path) -> str:
        version = ".".join(map(str, sys.version_info[:2]))
        where = (
            "in an isolated sandbox with no network access"
            if self.isolated
            else "directly on the host machine (no sandbox)"
        )
        return describe(
            f"Python {version} runs {where}",
            exec_timeout_s=settings.limits.exec_timeout_s,
            root="/workspace" if self.isolated else str(workspace.absolute()),
            memory_mb=settings.policy.sandbox.memory_mb,
            notes=f"Nothing can be installed.{_installed_packages(settings.policy.sandbox.packages)}",
        )

    def open(self, settings: Settings, workspace: Path, *, cancel: CancelToken | None = None) -> SandboxFactory:
        from fleet_kernel.sandbox.factory import SandboxFactory  # noqa: PLC0415 - the interpreter imports dspy

        limits, exec_timeout_s = settings.policy.sandbox, settings.limits.exec_timeout_s
        if self.isolated and (reason := _probe.probe_bwrap()) is not None:
            raise SandboxUnavailableError(
                f"The local sandbox cannot run: {reason}; or set FLEET_SANDBOX=unsafe-local to run without isolation."
            )
        # made without following a link, then named by its real path: the stage's copy-back refuses a link
        workspace = Path(os.path.realpath(Workspace(workspace.absolute()).ensure().root))
        if not self.isolated:
            logger.warning(
                "FLEET_SANDBOX=unsafe-local: model-written code runs WITHOUT isolation, with your user's "
                "files, network and credentials, in %s",
                workspace,
            )
        if self.isolated and limits.pool > 0:
            pool.POOL.configure(limits, limits.pool, limits.idle_stop_s)
            new_session: Callable[[], SandboxSession] = functools.partial(pool.sessions, workspace, limits)
        else:
            new_session = functools.partial(local.ProcessSession, workspace, limits, isolated=self.isolated)
        return SandboxFactory(
            new_session,
            backend="local" if self.isolated else "unsafe-local",
            execution_instructions=self.instructions(settings, workspace),
            exec_timeout_s=exec_timeout_s,
            cancel=cancel,
            max_output_bytes=limits.max_output_bytes,
        )

    def forget(self, settings: Settings, session_id: str) -> None:
        """Nothing outlives a turn: the workspace is the session's, deleted with it."""

    def admit(self, settings: Settings, workspace: Path) -> _slots.Reservation | None:
        """Reserve a slot under ``[sandbox] max_sandboxes`` for a turn working in ``workspace``, waiting briefly.

        None when a turn of that workspace runs in this process already (its claim is refused, or is its own).

        Raises:
            SandboxBusyError: no slot freed within ``ADMIT_WAIT_S``; the message names the cap.
        """
        key = str(workspace.absolute())
        if _slots.reserved(key):
            return None
        cap = settings.policy.sandbox.sandbox_cap
        reservation = _slots.reserve(key, cap, wait_s=ADMIT_WAIT_S)
        if reservation is None:
            raise SandboxBusyError(local.busy_message(cap))
        return reservation

    def prepare(self, settings: Settings) -> None:
        """Fill the pool of pre-started sandboxes now, before the first turn needs one (a server starting)."""
        limits = settings.policy.sandbox
        if self.isolated and limits.pool > 0 and _probe.probe_bwrap() is None:
            pool.POOL.configure(limits, limits.pool, limits.idle_stop_s)


LOCAL = LocalBackend(isolated=True)
UNSAFE_LOCAL = LocalBackend(isolated=False)
