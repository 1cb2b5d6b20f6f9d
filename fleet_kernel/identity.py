"""Who the kernel is, said once: its name, display name and language, for Jupyter, the kernel and exported notebooks.

Below every layer (no imports), so the transcript's notebook export says the same as the kernel without
depending on it; the kernelspec file that starts the kernel is ``fleet_kernel.kernel.spec``'s.
"""

from __future__ import annotations

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
