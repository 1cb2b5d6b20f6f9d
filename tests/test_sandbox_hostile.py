"""Hostile programs in the ``local`` sandbox: each is contained, and the next execute still works."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dspy.primitives.code_interpreter import CodeExecutionError

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import SandboxFactory, SandboxInterpreter, open_sandbox, probe_bwrap
from fleet_kernel.sandbox.local import _python_paths

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")
SECRET = "sk-secret-xyz"


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxFactory]:
    monkeypatch.setenv("FLEET_LM_API_KEY", SECRET)
    policy = Policy(limits=Limits(exec_timeout_s=3),
                    sandbox=SandboxLimits(memory_mb=512, max_processes=32, max_output_bytes=100_000))
    settings = Settings(home=tmp_path / "home", database_url="sqlite://", sandbox="local", policy=policy)
    made = open_sandbox(settings, tmp_path / "workspace")
    yield made
    made.close()


@pytest.fixture
def interp(factory: SandboxFactory) -> SandboxInterpreter:
    interpreter = factory()
    interpreter.execute("import os, sys, socket, subprocess, ctypes, time\nstate = 'kept'")
    return interpreter


def still_works(interp: SandboxInterpreter, state_kept: bool = True) -> None:
    assert interp.execute("1 + 1") == "2"
    if state_kept:
        assert interp.execute("state") == "'kept'"


def run(interp: SandboxInterpreter, code: str) -> Any:
    try:
        return interp.execute(code)
    except CodeExecutionError as exc:
        return f"ERROR: {exc}"


def test_host_files_are_invisible(interp: SandboxInterpreter, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "fleet.db").write_text("TOPSECRET")
    checks = {"/etc/shadow": "FileNotFoundError", "/etc/hostname": "FileNotFoundError",
              str(home / "fleet.db"): "FileNotFoundError", "/root/.bash_history": "FileNotFoundError"}
    for path, error in checks.items():
        assert error in run(interp, f"open({path!r}).read()"), path
    python = tuple(_python_paths())
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp", "run", "workspace"}
    top = set(eval(run(interp, "os.listdir('/')")))
    assert top <= allowed | {Path(p).parts[1] for p in python}, top
    stray = run(interp, f"[os.path.join(d, f) for top in {sorted(top - allowed)!r} for d, _, fs in os.walk('/' + top) "
                        f"for f in fs if not d.startswith({python!r})]")
    assert stray == "[]", stray
    grep = "subprocess.run(['grep', '-rls', 'TOP' + 'SECRET', '/etc', '/run', '/tmp', '/workspace', '/dev'], " \
           "capture_output=True, text=True).stdout"
    assert run(interp, grep) == "''"
    still_works(interp)


def test_secrets_in_the_host_environment_do_not_leak(interp: SandboxInterpreter) -> None:
    names = run(interp, "sorted(os.environ)")
    assert set(eval(names)) <= {"PATH", "HOME", "LANG", "PWD", "MALLOC_ARENA_MAX", "OPENBLAS_NUM_THREADS",
                                "OMP_NUM_THREADS", "MKL_NUM_THREADS", "XDG_CACHE_HOME", "MPLCONFIGDIR"}, names
    leaked = run(interp, f"""
found = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for name in ('environ', 'cmdline'):
            try:
                if b{SECRET!r} in open(f'/proc/{{pid}}/{{name}}', 'rb').read():
                    found.append((pid, name))
            except OSError:
                pass
found""")
    assert leaked == "[]"


def test_no_network_at_all(interp: SandboxInterpreter) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[Any] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    port = server.getsockname()[1]
    try:
        for host, port_ in (("127.0.0.1", port), ("1.1.1.1", 53)):
            out = run(interp, f"socket.create_connection(({host!r}, {port_}), timeout=2)")
            assert "ERROR" in out and "Address family not supported" in out, out
        assert "ERROR" in run(interp, "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)")
        assert run(interp, "len(socket.socketpair())") == "2"  # asyncio and multiprocessing still work
        time.sleep(0.1)
        assert accepted == []
    finally:
        server.close()
    still_works(interp)


def test_system_is_read_only_and_privileges_are_gone(interp: SandboxInterpreter) -> None:
    for path in ("/usr/evil", "/evil", "/etc/passwd"):
        assert "Read-only file system" in run(interp, f"open({path!r}, 'w')"), path
    status = run(interp, "print(open('/proc/self/status').read())")
    assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    assert run(interp, "ctypes.CDLL(None).unshare(0x10000000)") == "-1"  # CLONE_NEWUSER: denied by seccomp
    still_works(interp)


def test_fork_bomb_is_contained(interp: SandboxInterpreter) -> None:
    started = time.monotonic()
    out = run(interp, "while True:\n    os.fork()")
    assert "ERROR" in out and ("BlockingIOError" in out or "timed out" in out), out
    assert time.monotonic() - started < 10
    assert run(interp, "len([p for p in os.listdir('/proc') if p.isdigit()])") in ("'2'", "2")  # init + us
    still_works(interp)


def test_memory_bomb_is_a_memory_error_or_an_oom_restart(interp: SandboxInterpreter) -> None:
    assert "MemoryError" in run(interp, "hog = bytearray(4 * 1024 ** 3)")
    still_works(interp)
    out = run(interp, "hogs = []\nwhile True:\n    hogs.append(bytearray(64 * 1024 ** 2))")
    assert "MemoryError" in out or "ran out of memory (limit 512 MB)" in out, out
    still_works(interp, state_kept="MemoryError" in out)


def test_memory_bomb_in_a_child_process_is_killed(interp: SandboxInterpreter) -> None:
    code = ("r = subprocess.run([sys.executable, '-c', 'import os\\nx = [os.urandom(1) * 2**26 for _ in range(64)]'])\n"
            "r.returncode")
    assert run(interp, code).splitlines()[-1] in ("1", "-9")  # MemoryError (rlimit) or killed (cgroup)
    still_works(interp)


def test_infinite_loop_times_out(interp: SandboxInterpreter) -> None:
    assert "timed out after 3 s" in run(interp, "while True:\n    pass")
    still_works(interp)


def test_output_flood_is_capped_and_fast(interp: SandboxInterpreter) -> None:
    started = time.monotonic()
    out = run(interp, "for _ in range(1000):\n    sys.stdout.write('x' * 100_000)")
    assert len(out) < 101_000 and out.endswith("[output truncated: more than 100000 characters]")
    out = run(interp, "os.system('head -c 100000000 /dev/zero | tr \"\\\\0\" y')")
    assert out.startswith("yyyy") and len(out) < 101_000
    assert time.monotonic() - started < 8
    still_works(interp)


def test_segfault_restarts_the_worker(interp: SandboxInterpreter) -> None:
    out = run(interp, "print('before')\ntime.sleep(0.2)\nctypes.string_at(0)")
    assert out.startswith("ERROR: before\n") and "segmentation fault" in out and "restarted" in out, out
    still_works(interp, state_kept=False)


def test_killing_the_sandbox_init_or_itself(interp: SandboxInterpreter) -> None:
    assert run(interp, "os.kill(os.getppid(), 9)\nsubprocess.Popen(['sleep', '60'])\nos.kill(-1, 9)\n'survived'") \
        == "'survived'"
    still_works(interp)
    out = run(interp, "os.kill(os.getpid(), 9)")
    assert "killed" in out and "restarted" in out
    still_works(interp, state_kept=False)
