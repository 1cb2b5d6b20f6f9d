"""The pool never hands out a dead sandbox: real bubblewrap workers, one killed with SIGKILL while it waits."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import open_sandbox, pool, probe_bwrap
from fleet_kernel.sandbox._support import SANDBOX_RUNTIME
from fleet_kernel.sandbox.pool import Pool

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")


def make_settings(tmp_path: Path) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=20), sandbox=SandboxLimits(pool_size=1))
    return Settings(home=tmp_path / "home", database_url="sqlite://", sandbox="local", policy=policy)  # type: ignore[arg-type]


def wait_for(check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


@pytest.fixture
def own_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    fresh = Pool()
    monkeypatch.setattr(pool, "POOL", fresh)
    yield fresh
    fresh.close()


def sandboxed_python(stage_pid: int) -> psutil.Process:
    """The runtime a ready worker runs under bubblewrap (what ``ps`` shows as the sandbox's Python)."""
    for child in psutil.Process(stage_pid).children(recursive=True):
        if SANDBOX_RUNTIME in " ".join(child.cmdline()):
            return child
    raise AssertionError("no sandboxed runtime under the stage")


def gone(stage_pid: int) -> bool:
    """Nothing under the stage runs any more: the runtime and bubblewrap around it have exited."""
    children = psutil.Process(stage_pid).children(recursive=True)
    return all(not child.is_running() or child.status() == psutil.STATUS_ZOMBIE for child in children)


def test_a_pooled_sandbox_killed_while_it_waits_is_not_handed_out(tmp_path: Path, own_pool: Pool) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    factory = open_sandbox(make_settings(tmp_path), workspace)
    try:
        wait_for(lambda: own_pool.ready() == 1)
        stage = own_pool._ready[0]._process.pid  # type: ignore[union-attr]
        os.kill(sandboxed_python(stage).pid, signal.SIGKILL)
        wait_for(lambda: gone(stage))
        interpreter = factory()
        assert interpreter.execute("print(6 * 7)") == "42"  # the first step runs; no "the sandbox process exited"
        interpreter.shutdown()
    finally:
        factory.close()


@pytest.mark.slow
def test_a_dead_ready_sandbox_is_replaced_without_a_take(tmp_path: Path, own_pool: Pool) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    factory = open_sandbox(make_settings(tmp_path), workspace)
    try:
        wait_for(lambda: own_pool.ready() == 1)
        first = own_pool._ready[0]
        os.kill(sandboxed_python(first._process.pid).pid, signal.SIGKILL)  # type: ignore[union-attr]
        wait_for(lambda: own_pool.ready() == 1 and own_pool._ready[0] is not first)
        assert own_pool._ready[0].healthy()
    finally:
        factory.close()
