"""The pool of pre-started local sandboxes: real bubblewrap workers, no mocks, no timing assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings, load_settings
from fleet_kernel.sandbox import open_sandbox, pool, probe_bwrap
from fleet_kernel.sandbox._protocol import SessionClosed
from fleet_kernel.sandbox.pool import Phase, Pool, PooledSession
from fleet_kernel.sandbox.runtime import MessageType

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")

ROOT = Path(__file__).resolve().parents[1]


def make_settings(tmp_path: Path, **sandbox: Any) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=20), sandbox=SandboxLimits(**sandbox))
    return Settings(home=tmp_path / "home", database_url="sqlite://", sandbox="local", policy=policy)  # type: ignore[arg-type]


def wait_for(check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


@pytest.fixture
def own_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pool]:
    """A pool of this test's own in place of the process-wide one."""
    fresh = Pool()
    monkeypatch.setattr(pool, "POOL", fresh)
    yield fresh
    fresh.close()


def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def test_first_execution_uses_a_pre_started_sandbox_and_the_pool_refills(tmp_path: Path, own_pool: Pool) -> None:
    settings = make_settings(tmp_path, pool_size=2)
    factory = open_sandbox(settings, workspace(tmp_path))
    try:
        wait_for(lambda: own_pool.ready() == 2)
        interpreter = factory()
        assert interpreter.execute("print(6 * 7)") == "42"
        session = interpreter._session
        assert isinstance(session, PooledSession) and session.pooled
        assert own_pool.handed_out == 1
        wait_for(lambda: own_pool.ready() == 2)  # refilled in the background
        assert own_pool.started == 3
        interpreter.shutdown()
    finally:
        factory.close()


def test_a_pooled_sandbox_adopts_an_existing_workspace_and_saves_it_back(tmp_path: Path, own_pool: Pool) -> None:
    settings = make_settings(tmp_path, pool_size=1)
    root = workspace(tmp_path)
    (root / "files").mkdir()
    (root / "files" / "notes.txt").write_text("from an earlier turn")
    factory = open_sandbox(settings, root)
    try:
        wait_for(lambda: own_pool.ready() == 1)
        interpreter = factory()
        code = "print(open('files/notes.txt').read())\n_ = open('artifacts/out.txt', 'w').write('new')"
        assert interpreter.execute(code) == "from an earlier turn"
        assert interpreter._session.pooled  # type: ignore[union-attr]
        interpreter.shutdown()
    finally:
        factory.close()
    assert (root / "artifacts" / "out.txt").read_text() == "new"


def test_a_worker_started_by_the_pool_thread_outlives_the_thread_that_asked(tmp_path: Path, own_pool: Pool) -> None:
    settings = make_settings(tmp_path, pool_size=1)
    opened: list[Any] = []
    asker = threading.Thread(target=lambda: opened.append(open_sandbox(settings, workspace(tmp_path))))
    asker.start()
    asker.join()
    factory = opened[0]
    try:
        wait_for(lambda: own_pool.ready() == 1)
        interpreter = factory()
        assert interpreter.execute("print('alive')") == "alive"
        assert interpreter._session.pooled  # type: ignore[union-attr]
        interpreter.shutdown()
    finally:
        factory.close()


def test_pool_size_zero_starts_sandboxes_cold(tmp_path: Path, own_pool: Pool) -> None:
    settings = make_settings(tmp_path, pool_size=0)
    factory = open_sandbox(settings, workspace(tmp_path))
    try:
        interpreter = factory()
        assert interpreter.execute("print(1)") == "1"
        assert not isinstance(interpreter._session, PooledSession)
        assert own_pool.started == 0 and own_pool.ready() == 0
        interpreter.shutdown()
    finally:
        factory.close()


def test_pool_size_setting_from_fleet_toml(tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[sandbox]\npool_size = 3\nidle_stop_s = 45\n")
    limits = load_settings({"FLEET_CONFIG": str(config), "FLEET_HOME": str(tmp_path)}).policy.sandbox
    assert (limits.pool, limits.idle_stop_s) == (3, 45)
    (tmp_path / "empty.toml").write_text("")
    default = load_settings({"FLEET_HOME": str(tmp_path), "FLEET_CONFIG": str(tmp_path / "empty.toml")})
    assert default.policy.sandbox.pool == min(4, os.cpu_count() or 1)


def test_an_idle_sandbox_is_stopped_and_the_next_execution_has_the_workspace(tmp_path: Path, own_pool: Pool) -> None:
    settings = make_settings(tmp_path, pool_size=1, idle_stop_s=1)
    root = workspace(tmp_path)
    factory = open_sandbox(settings, root)
    try:
        interpreter = factory()
        interpreter.execute("open('files/kept.txt', 'w').write('written before')\nx = 1")
        first = interpreter._session
        assert isinstance(first, PooledSession)
        wait_for(first.saved.is_set)  # stopped once idle; its workspace was copied back
        assert not first.alive()
        assert first.phase is Phase.IDLE_STOPPED
        assert (root / "files" / "kept.txt").read_text() == "written before"
        with pytest.raises(CodeExecutionError, match="without running code.*files in /workspace are kept"):
            interpreter.execute("print(x)")
        assert first.phase is Phase.IDLE_STOPPED  # killed after its stop: a new session still waits for its copy-back
        assert interpreter.execute("print(open('files/kept.txt').read())") == "written before"
        interpreter.shutdown()
    finally:
        factory.close()


def test_a_session_killed_before_it_starts_never_starts(tmp_path: Path, own_pool: Pool) -> None:
    session = PooledSession(own_pool, workspace(tmp_path), SandboxLimits())
    with pytest.raises(SessionClosed):  # nothing to send to yet
        session.send({"type": MessageType.INTERRUPT})
    session.kill()
    assert session.phase is Phase.KILLED
    with pytest.raises(SessionClosed):
        session.start()
    assert session.phase is Phase.KILLED and not session.alive()


def test_the_pool_refills_while_sessions_keep_taking_workers(tmp_path: Path, own_pool: Pool) -> None:
    # Takes come faster than the refill delay: each must not put the refill off again.
    settings = make_settings(tmp_path, pool_size=1)
    factory = open_sandbox(settings, workspace(tmp_path))
    try:
        wait_for(lambda: own_pool.ready() == 1)
        deadline = time.monotonic() + 30  # a loaded machine boots slowly; unfixed, the pool never refills
        while time.monotonic() < deadline and own_pool.handed_out < 3:
            interpreter = factory()
            assert interpreter.execute("print('step')") == "step"
            interpreter.shutdown()
            time.sleep(pool.REFILL_DELAY_S / 3)
        assert own_pool.handed_out >= 3, f"{own_pool.handed_out} pre-started sandboxes handed out in 30 s"
    finally:
        factory.close()


def test_a_stop_returns_with_the_workspace_saved_and_the_sandbox_is_reaped_after(
    tmp_path: Path, own_pool: Pool
) -> None:
    settings = make_settings(tmp_path, pool_size=1)
    root = workspace(tmp_path)
    factory = open_sandbox(settings, root)
    try:
        wait_for(lambda: own_pool.ready() == 1)
        interpreter = factory()
        interpreter.execute("_ = open('artifacts/late.txt', 'w').write('saved first')")
        worker = interpreter._session._worker  # type: ignore[union-attr]
        stage, cgroup = psutil.Process(worker._process.pid), worker._cgroup
        interpreter.shutdown()
        assert (root / "artifacts" / "late.txt").read_text() == "saved first"  # back before the stop returned
        assert not worker.alive()
        wait_for(lambda: not stage.is_running(), 10)  # exited and reaped: no zombie left behind
        if cgroup is not None:
            wait_for(lambda: not any(path.exists() for path in cgroup.dirs), 10)
    finally:
        factory.close()


def test_the_stage_s_saved_channel_never_reaches_sandbox_code(tmp_path: Path, own_pool: Pool) -> None:
    # Code that could write "saved" on it would end a stop before its workspace is copied back.
    factory = open_sandbox(make_settings(tmp_path, pool_size=0), workspace(tmp_path))
    try:
        interpreter = factory()
        listing = (
            "import os\nfds = []\nfor n in os.listdir('/proc/self/fd'):\n"
            "    try:\n        fds.append(os.readlink(f'/proc/self/fd/{n}'))\n"
            "    except OSError:\n        pass  # the listing's own descriptor, closed by now\n"
            "print(sorted(fds))"
        )
        seen = interpreter.execute(listing)
        worker = interpreter._session  # without a pool, the stage's own session
        assert worker._saved is not None  # type: ignore[union-attr]
        channel = f"pipe:[{os.fstat(worker._saved).st_ino}]"  # type: ignore[union-attr]
        assert "pipe:[" in seen and channel not in seen, seen
        interpreter.shutdown()
    finally:
        factory.close()


SHUTDOWN_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
    from fleet_kernel.sandbox import _support, open_sandbox, pool
    policy = Policy(limits=Limits(exec_timeout_s=20), sandbox=SandboxLimits(pool_size=2))
    settings = Settings(home=Path(sys.argv[1]), database_url="sqlite://", sandbox="local", policy=policy)
    factory = open_sandbox(settings, Path(sys.argv[1]) / "ws")
    interpreter = factory()
    interpreter.execute("print(1)")  # one bound sandbox still running at exit, two ready in the pool
    deadline = time.monotonic() + 60
    while pool.POOL.ready() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"support": str(_support.support_dir()), "ready": pool.POOL.ready()}), flush=True)
""")


def sandboxes_of(support: str) -> list[str]:
    """Command lines of live processes (stage or bubblewrap) that mount this process's support folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if support in cmdline:
                found.append(cmdline)
    return found


@pytest.mark.slow
def test_nothing_is_left_running_at_shutdown(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ready"] == 2
    wait_for(lambda: not sandboxes_of(report["support"]), timeout_s=30)


@pytest.mark.slow
def test_ready_sandboxes_end_when_their_host_is_killed(tmp_path: Path) -> None:
    script = SHUTDOWN_SCRIPT + "time.sleep(600)\n"
    host = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert host.stdout is not None
        report = json.loads(host.stdout.readline())
        assert report["ready"] == 2 and sandboxes_of(report["support"])
    finally:
        host.kill()  # no exit hooks run: the stages see their adopt socket close
        host.wait()
    wait_for(lambda: not sandboxes_of(report["support"]), timeout_s=60)
