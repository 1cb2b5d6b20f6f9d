"""Fixtures for the telemetry suites: the kernel harness of tests/kernel, for turns run by a real kernel."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "kernel"))

from kernel_harness import KERNEL


@pytest.fixture(scope="session")
def kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kernel spec installed as ``fleet-test`` in a temp prefix that Jupyter (and its children) search."""
    from fleet_kernel.kernel.install import install

    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install(prefix=str(prefix), name=KERNEL)
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    yield prefix
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old
