"""The kernelspec that starts this kernel; its name, display name and language are ``fleet_kernel.identity``'s.

``share/jupyter/kernels/fleet/kernel.json`` (the spec pip installs) is ``kernel_json("python")``; a test keeps it so.
"""

from __future__ import annotations

from typing import Any

from fleet_kernel.identity import DISPLAY_NAME, KERNELSPEC, LANGUAGE, LANGUAGE_INFO, NAME

__all__ = ["DISPLAY_NAME", "KERNELSPEC", "LANGUAGE", "LANGUAGE_INFO", "NAME", "kernel_json"]


def kernel_json(python: str) -> dict[str, Any]:
    """The kernelspec file that starts this kernel with ``python``."""
    return {
        "argv": [python, "-Xfrozen_modules=off", "-m", "fleet_kernel", "-f", "{connection_file}"],
        "display_name": DISPLAY_NAME,
        "language": LANGUAGE,
        "interrupt_mode": "message",
        "metadata": {"debugger": False},
    }


NOTEBOOK_DIR_ENV = "FLEET_NOTEBOOK_DIR"
"""Set by Fleet's papermill engine for its kernel: the folder of the notebook papermill runs."""
