"""The kernel's identity (DESIGN.md: name ``fleet``, "Fleet RLM", language ``markdown``) is said once, in
``fleet_kernel.kernel.spec``, and every place Jupyter reads it agrees."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fleet_kernel.kernel import spec
from fleet_kernel.kernel.install import kernel_spec
from fleet_kernel.kernel.kernel import FleetKernel

SHIPPED = Path(__file__).resolve().parents[2] / "share" / "jupyter" / "kernels" / "fleet" / "kernel.json"


def test_the_identity_is_the_contracts() -> None:
    assert (spec.NAME, spec.DISPLAY_NAME, spec.LANGUAGE) == ("fleet", "Fleet RLM", "markdown")
    assert spec.KERNELSPEC == {"name": "fleet", "display_name": "Fleet RLM", "language": "markdown"}


def test_the_kernel_json_pip_installs_is_the_one_install_writes() -> None:
    assert SHIPPED.parent.name == spec.NAME
    assert json.loads(SHIPPED.read_text()) == spec.kernel_json("python")  # Jupyter resolves a bare python
    assert kernel_spec() == spec.kernel_json(sys.executable)


def test_the_kernel_reports_the_same_identity() -> None:
    assert FleetKernel.implementation == spec.NAME
    assert FleetKernel.language_info == spec.LANGUAGE_INFO
    assert FleetKernel.banner.startswith(spec.DISPLAY_NAME)
