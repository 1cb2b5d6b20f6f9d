"""The names of the sandbox backends, and where each one is defined.

It imports nothing of Fleet, so ``fleet_kernel.config`` checks ``FLEET_SANDBOX`` and ``[sandbox] backend``
against it without depending on the sandboxes; ``fleet_kernel.sandbox.contract`` registers backends here and
resolves a name to its backend.
"""

from __future__ import annotations

# name -> a backend, or "module:attribute" naming one (imported on first use, so listing names is cheap)
BUILTIN: dict[str, object] = {
    "local": "fleet_kernel.sandbox.local_backend:LOCAL",
    "pyodide": "fleet_kernel.sandbox.pyodide:BACKEND",
    "daytona": "fleet_kernel.sandbox.daytona:BACKEND",
    "unsafe-local": "fleet_kernel.sandbox.local_backend:UNSAFE_LOCAL",
}
entries: dict[str, object] = dict(BUILTIN)


def names() -> tuple[str, ...]:
    """Every registered name, built-ins first."""
    return tuple(entries)
