"""Install the ``fleet`` kernelspec: ``fleet kernel install [--user | --sys-prefix | --prefix P]``.

``pip install`` already ships the spec as wheel shared-data (``{venv}/share/jupyter/kernels/fleet``),
with a bare ``python`` that Jupyter resolves to its own interpreter. This command writes the spec with
this interpreter's absolute path, so a Jupyter running from another environment starts the right one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fleet_kernel.kernel import spec

KERNEL_NAME = spec.NAME
LOGOS = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")


def kernel_spec(python: str = sys.executable) -> dict[str, object]:
    return spec.kernel_json(python)


def _logo_dir() -> Path | None:
    """Where the logos are: the source tree's ``share/`` or the installed shared-data."""
    candidates = [
        Path(__file__).resolve().parents[2] / "share" / "jupyter" / "kernels" / KERNEL_NAME,
        Path(sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME,
    ]
    for folder in candidates:
        if (folder / LOGOS[0]).is_file():
            return folder
    return None


def install(user: bool = False, sys_prefix: bool = False, prefix: str | None = None, name: str = KERNEL_NAME) -> str:
    """Install the spec; returns the folder it was written to.

    Args:
        user: into the user's Jupyter data folder (the default when not root and nothing else is given;
            as root, the default is the system-wide folder).
        sys_prefix: into this Python environment (``sys.prefix``).
        prefix: under this prefix (``PREFIX/share/jupyter/kernels/fleet``).
        name: the kernel name (tests install ``fleet-test``).
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if sys_prefix:
        prefix = sys.prefix
    if not (user or prefix) and os.geteuid() != 0:
        user = True  # a system-wide install needs root; default to the user's folder, as bash_kernel does
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernel_spec(), indent=1) + "\n")
        logos = _logo_dir()
        for logo in LOGOS if logos else ():
            shutil.copy(logos / logo, Path(tmp) / logo)  # type: ignore[operator]
        return str(KernelSpecManager().install_kernel_spec(tmp, name, user=user and not prefix, prefix=prefix))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="fleet kernel install", description=f"Install the {spec.DISPLAY_NAME} kernelspec."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help="install into this Python environment")
    where.add_argument("--prefix", help="install under this prefix")
    args = parser.parse_args(argv)
    path = install(user=args.user, sys_prefix=args.sys_prefix, prefix=args.prefix)
    print(f"Installed the {KERNEL_NAME} kernelspec in {path}")


if __name__ == "__main__":
    main()
