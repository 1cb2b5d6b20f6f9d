"""Who the kernel is, said once: its name, display name and language, for Jupyter, the kernel and exported notebooks.

``share/jupyter/kernels/fleet/kernel.json`` (the spec pip installs) is ``kernel_json("python")``; a test keeps it so.
"""

from __future__ import annotations

from typing import Any

NAME = "fleet"
DISPLAY_NAME = "Fleet RLM"
LANGUAGE_INFO: dict[str, object] = {
    "name": "markdown",
    "mimetype": "text/markdown",
    "file_extension": ".md",
    "pygments_lexer": "markdown",
    "codemirror_mode": "markdown",
}
LANGUAGE = LANGUAGE_INFO["name"]
KERNELSPEC = {"name": NAME, "display_name": DISPLAY_NAME, "language": LANGUAGE}
"""A notebook's ``metadata.kernelspec``."""


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
