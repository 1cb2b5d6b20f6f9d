"""Fixtures for the kernel suites: a ``fleet-test`` kernelspec in a temp prefix, and real kernels over ZMQ.

``kernel`` is the worker's shared kernel, handed to each test in a new session with the kernel-wide state put
back (``shared_kernel.py``); ``start_kernel(**env)`` starts a fresh one, for what start-up, warm-up,
interrupts, kills, shutdowns and other settings do.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from homes import env_for, new_home
from kernel_harness import CHROMIUM, KERNEL, SHARED_KERNEL, Kernel, PythonKernel, SharedKernel, SharedPython
from ports import free_port
from scripted_lm import ScriptedLM

K = TypeVar("K", Kernel, PythonKernel)


@pytest.fixture(scope="session", autouse=True)
def kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Install the spec as ``fleet-test`` (and ``fleet-test-shared``) and point Jupyter (and every child process)
    at it."""
    from fleet_kernel.kernel.install import install

    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    folder = Path(install(prefix=str(prefix), name=KERNEL))
    shared = folder.parent / SHARED_KERNEL
    shutil.copytree(folder, shared)
    spec = json.loads((shared / "kernel.json").read_text())
    spec["argv"] = [sys.executable, "-Xfrozen_modules=off", str(Path(__file__).with_name("shared_kernel.py")),
                    "-f", "{connection_file}"]  # fmt: skip
    (shared / "kernel.json").write_text(json.dumps(spec, indent=1))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    yield prefix
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


def _fresh(make: Callable[[dict[str, str]], K], fleet_env: dict[str, str]) -> Iterator[Callable[..., K]]:
    """``start(**env)``: a fresh kernel on the test's store and scripted LM; all are shut down after the test."""
    kernels: list[K] = []

    def start(**env: str) -> K:
        kernel = make({**fleet_env, **env})
        kernels.append(kernel)
        return kernel

    yield start
    for kernel in kernels:
        kernel.close()


@pytest.fixture
def start_kernel(fleet_env: dict[str, str]) -> Iterator[Callable[..., Kernel]]:
    """``start_kernel(**env)`` starts a fresh ``fleet-test`` kernel."""
    yield from _fresh(Kernel, fleet_env)


@pytest.fixture(scope="session")
def shared_kernel(
    tmp_path_factory: pytest.TempPathFactory, migrated_store_file: Path, shared_scripted_lm: ScriptedLM
) -> Iterator[SharedKernel]:
    """The worker's shared kernel (started when a test first asks for it) on the worker's LM and a home of its own."""
    home = new_home(tmp_path_factory.mktemp("shared-kernel"), migrated_store_file)
    cwd = home.parent / "cwd"
    cwd.mkdir()
    shared = SharedKernel(env_for(home, shared_scripted_lm), shared_scripted_lm, cwd=str(cwd))
    yield shared
    shared.close()


@pytest.fixture(scope="session")
def shared_python(
    tmp_path_factory: pytest.TempPathFactory, migrated_store_file: Path, shared_scripted_lm: ScriptedLM
) -> Iterator[SharedPython]:
    """The worker's shared python3 kernel with ``%load_ext fleet_kernel``, started when a test first asks for it."""
    home = new_home(tmp_path_factory.mktemp("shared-python"), migrated_store_file)
    shared = SharedPython(env_for(home, shared_scripted_lm), shared_scripted_lm)
    yield shared
    shared.close()


@pytest.fixture
def py(shared_python: SharedPython, scripted_lm: ScriptedLM) -> PythonKernel:
    """The shared python3 kernel: idle, no notebook variables or cells, the magic's and engine's state put back."""
    return shared_python.hand_over()


@pytest.fixture
def start_python(fleet_env: dict[str, str]) -> Iterator[Callable[..., PythonKernel]]:
    """``start_python(**env)``: a fresh python3 kernel with the magic."""
    yield from _fresh(PythonKernel, fleet_env)


@pytest.fixture
def kernel(shared_kernel: SharedKernel, scripted_lm: ScriptedLM) -> Kernel:
    """The shared kernel: idle, in a new session of its own, the kernel-wide state and the LM put back."""
    return shared_kernel.hand_over()


@pytest.fixture(scope="session")
def lab_server(
    tmp_path_factory: pytest.TempPathFactory, migrated_store_file: Path, shared_scripted_lm: ScriptedLM
) -> Iterator[tuple[str, str, Path]]:
    """One JupyterLab server on loopback for the browser tests, on the worker's LM and a home of its own:
    ``(base URL, token, root folder)``. Starting one took ~2 s, and stopping it ~1.5 s, per test."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    lab_bin = Path(sys.executable).parent / "jupyter-lab"
    if not lab_bin.exists():
        pytest.skip("jupyterlab is not installed")
    root = tmp_path_factory.mktemp("lab")
    env = {**os.environ, **env_for(new_home(root, migrated_store_file), shared_scripted_lm)}
    port, token = free_port(), secrets.token_hex(8)
    command = [str(lab_bin), "--allow-root", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.news_url=None"]  # fmt: skip
    with (root / "lab.log").open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail(f"JupyterLab did not start: {(root / 'lab.log').read_text()[-2000:]}")
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture
def lab(
    lab_server: tuple[str, str, Path], scripted_lm: ScriptedLM, request: pytest.FixtureRequest
) -> Iterator[tuple[str, Path]]:
    """A folder of this test's own in the shared JupyterLab: yields the URL of its ``t.ipynb`` (with the token) and
    the folder. The kernels the test's notebook started are shut down after it; ``scripted_lm`` (the LM the
    server's kernels use) is reset for the test."""
    base, token, root = lab_server
    folder = root / request.node.name.split("[")[0]
    folder.mkdir()
    yield f"{base}/lab/tree/{folder.name}/t.ipynb?reset&token={token}", folder  # reset: no tab of an earlier test
    kernels = json.loads(urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=30).read())
    for kernel in kernels:
        stop = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(stop, timeout=30)
