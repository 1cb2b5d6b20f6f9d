"""Fixtures for the kernel suites: a ``fleet-test`` kernelspec in a temp prefix, and real kernels over ZMQ."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_harness import KERNEL, Kernel


@pytest.fixture(scope="session", autouse=True)
def kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Install the spec as ``fleet-test`` and point Jupyter (and every child process) at it."""
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


@pytest.fixture
def start_kernel(fleet_env: dict[str, str]) -> Iterator[Any]:
    """``start_kernel(**env)`` starts a kernel on the test's store and scripted LM; all are shut down after."""
    kernels: list[Kernel] = []

    def start(**env: str) -> Kernel:
        kernel = Kernel({**fleet_env, **env})
        kernels.append(kernel)
        return kernel

    yield start
    for kernel in kernels:
        kernel.close()


@pytest.fixture
def kernel(start_kernel: Any) -> Kernel:
    return start_kernel()
