"""Hostile neighbours: other local users, host paths seen from inside, and a workspace quota (local sandbox).

Real bubblewrap workers and a real SQLite store in a temporary FLEET_HOME; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import SandboxFactory, open_sandbox, probe_bwrap
from fleet_kernel.store import Store
from fleet_kernel.workspace import MEMORY_FILE, Workspace

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")
SESSION = "sess-0123456789abcdef"
OTHER_UID = 54321  # an account with no business in anyone's FLEET_HOME


def make_settings(home: Path, **sandbox: Any) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=30), sandbox=SandboxLimits(**sandbox))
    return Settings(home=home, database_url=f"sqlite+aiosqlite:///{home / 'fleet.db'}", sandbox="local", policy=policy)


@pytest.fixture
def home() -> Iterator[Path]:
    """FLEET_HOME in a folder every user can enter (pytest's own tmp_path is private to its user)."""
    parent = Path(tempfile.mkdtemp(prefix="fleet-neighbours-"))
    parent.chmod(0o755)
    yield parent / "fleet-home"
    shutil.rmtree(parent, ignore_errors=True)


def run_turn(settings: Settings, code: str) -> str | None:
    """One interpreter's life in a session workspace, as a turn has it: start, execute, stop."""
    workspace = Workspace.for_session(settings.workspaces_dir, SESSION)
    factory: SandboxFactory = open_sandbox(settings, workspace.root)
    try:
        interp = factory()
        result = interp.execute(code)
        interp.shutdown()
        return result  # type: ignore[return-value]
    finally:
        factory.close()


def open_store(settings: Settings) -> None:
    async def go() -> None:
        store = await Store.open(settings.database_url)
        await store.close()

    asyncio.run(go())


def as_other_user(action: str, path: Path) -> str:
    """What happens when another local user tries ``action`` ("read" or "append") on ``path``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes the other user and reports back
        os.close(read_fd)
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            with path.open("rb" if action == "read" else "ab") as handle:
                handle.read(1) if action == "read" else handle.write(b"\ninjected by a neighbour\n")
            outcome = "allowed"
        except PermissionError:
            outcome = "denied"
        except BaseException as exc:  # noqa: BLE001 - report, never run on in the fork
            outcome = f"error {exc!r}"
        os.write(write_fd, outcome.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


def writable_by_others(home: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [".", *dirnames, *filenames]:
            path = Path(dirpath, name)
            if not path.is_symlink() and path.lstat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                found.append(f"{path} {oct(path.lstat().st_mode & 0o777)}")
    return found


WRITE_EVERYWHERE = """
import os
os.makedirs('artifacts/plots', exist_ok=True)
open('artifacts/plots/p.txt', 'w').write('plot')
open('files/notes.txt', 'w').write('notes')
with open('memory/MEMORIES.md', 'a') as handle:
    handle.write('- remembered\\n')
print(os.getuid())
"""


def test_a_turn_leaves_fleet_home_private_and_sandbox_writes_kept(home: Path) -> None:
    settings = make_settings(home)
    open_store(settings)
    assert run_turn(settings, WRITE_EVERYWHERE) == "65534"
    open_store(settings)  # a second opening (WAL and shm files exist now)
    root = settings.workspaces_dir / SESSION
    assert (root / "artifacts/plots/p.txt").read_text() == "plot"
    assert (root / "files/notes.txt").read_text() == "notes"
    assert (root / MEMORY_FILE).read_text().endswith("- remembered\n")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for name in ("fleet.db", "fleet.db-wal", "fleet.db-shm"):
        if (home / name).exists() or name == "fleet.db":
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    assert writable_by_others(home) == []


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another local user needs root")
def test_another_local_user_can_neither_read_the_store_nor_write_memory(home: Path) -> None:
    settings = make_settings(home)
    open_store(settings)
    run_turn(settings, WRITE_EVERYWHERE)
    memory = settings.workspaces_dir / SESSION / MEMORY_FILE
    assert as_other_user("read", home / "fleet.db") == "denied"
    assert as_other_user("append", memory) == "denied"
    assert as_other_user("read", settings.workspaces_dir / SESSION / "artifacts/plots/p.txt") == "denied"
    assert "neighbour" not in memory.read_text()


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def host_uids(pid: int) -> set[int]:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return {int(uid) for uid in line.split()[1:]}


@pytest.mark.skipif(os.getuid() != 0, reason="only a root host maps the sandbox to a uid of its own")
def test_a_root_host_runs_the_sandbox_as_an_unprivileged_uid(home: Path) -> None:
    settings = make_settings(home)
    workspace = Workspace.for_session(settings.workspaces_dir, SESSION)
    factory = open_sandbox(settings, workspace.root)
    try:
        interp = factory()
        assert interp.execute("import os; os.getuid()") == "65534"
        stage = interp._session._process.pid  # what `ps` shows on the host
        sandbox = descendants(stage)
        assert sandbox, "bubblewrap and the worker run under the stage process"
        uids = set().union(*(host_uids(pid) for pid in sandbox))
        assert 0 not in uids and min(uids) >= 1 << 24, uids
    finally:
        factory.close()


def test_mountinfo_names_no_host_folder_of_the_session(home: Path) -> None:
    mountinfo = str(run_turn(make_settings(home), "print(open('/proc/self/mountinfo').read())"))
    assert "/workspace" in mountinfo
    for secret in (str(home), SESSION, str(home.parent)):
        assert secret not in mountinfo


def test_mountinfo_names_no_host_python(home: Path) -> None:
    mountinfo = str(
        run_turn(
            make_settings(home),
            "import sys\nprint(sys.prefix, sys.executable)\nprint(open('/proc/self/mountinfo').read())",
        )
    )
    interpreter = os.path.realpath(sys.executable)
    for secret in (sys.prefix, sys.base_prefix, interpreter, os.path.dirname(os.path.dirname(interpreter))):
        if not secret.startswith("/usr/"):  # /usr is bound as /usr
            assert secret not in mountinfo


QUOTA_BYTES = """
import errno
try:
    with open('artifacts/big.bin', 'wb') as handle:
        for _ in range(8):
            handle.write(b'x' * (1 << 20))
    print('wrote 8 MB')
except OSError as exc:
    print('bytes', errno.errorcode[exc.errno])
"""
QUOTA_FILES = """
import errno, os
made = 0
try:
    for n in range(1000):
        open(f'artifacts/f{n}', 'w').close()
        made += 1
    print('made 1000 files')
except OSError as exc:
    print('files', errno.errorcode[exc.errno], made < 200)
"""


def test_workspace_quota_is_a_catchable_oserror_and_the_next_turn_works(home: Path) -> None:
    settings = make_settings(home, workspace_mb=5, workspace_files=200)
    assert run_turn(settings, QUOTA_BYTES) == "bytes ENOSPC"
    root = settings.workspaces_dir / SESSION
    assert (root / "artifacts/big.bin").stat().st_size <= 5 * 1024 * 1024  # what fitted, and no more
    assert run_turn(settings, "import os; os.remove('artifacts/big.bin'); print('freed')") == "freed"
    assert run_turn(settings, QUOTA_FILES) == "files ENOSPC True"
    assert run_turn(settings, "import os; print(len(os.listdir('artifacts')) > 150)") == "True"
    assert len(list((root / "artifacts").iterdir())) < 200
    cleanup = "import os\nfor n in os.listdir('artifacts'): os.remove('artifacts/' + n)\nprint('ok')"
    assert run_turn(settings, cleanup) == "ok"
    assert run_turn(settings, "open('memory/MEMORIES.md', 'a').write('- after\\n'); print('fine')") == "fine"
    assert list((root / "artifacts").iterdir()) == []
    assert (root / MEMORY_FILE).read_text().endswith("- after\n")


def test_default_quota_lets_ordinary_work_through(home: Path) -> None:
    assert run_turn(make_settings(home), "open('artifacts/a.csv', 'w').write('a,b\\n' * 100000); print('ok')") == "ok"
    assert (make_settings(home).workspaces_dir / SESSION / "artifacts/a.csv").stat().st_size == 400000


def test_what_code_leaves_in_its_copy_cannot_trip_the_copy_back(home: Path) -> None:
    settings = make_settings(home)
    code = (
        "import os\nos.mkfifo('artifacts/pipe')\nos.link('memory/MEMORIES.md', 'artifacts/hard')\n"
        "os.chdir('artifacts')\nfor _ in range(100):\n    os.mkdir('d'); os.chdir('d')\n"
        "open('deep.txt', 'w').write('x')\nprint('left')"
    )
    assert run_turn(settings, code) == "left"
    root = settings.workspaces_dir / SESSION
    assert not (root / "artifacts/pipe").exists()
    hard = root / "artifacts/hard"
    assert hard.is_file() and hard.stat().st_nlink == 1 and hard.read_text() == (root / MEMORY_FILE).read_text()
    assert (
        run_turn(settings, "print(sorted(os.listdir('artifacts')) if (os := __import__('os')) else 0)")
        == "['d', 'hard']"
    )
    assert writable_by_others(home) == []


def test_sparse_files_cost_the_host_no_more_than_they_cost_the_sandbox(home: Path) -> None:
    """A hole costs nothing in the tmpfs; copied back as bytes, files of max_file_mb each would fill the host's disk."""
    settings = make_settings(home, workspace_mb=64, max_file_mb=200)
    code = (
        "import os\n"
        "for i in range(8):\n"
        "    with open(f'/workspace/artifacts/sparse-{i}.bin', 'wb') as f:\n"
        "        f.write(b'head'); f.seek(190 << 20); f.write(b'tail')\n"
        "print('made')\n"
    )
    assert "made" in str(run_turn(settings, code))
    artifacts = Workspace.for_session(settings.workspaces_dir, SESSION).root / "artifacts"
    copied = sorted(artifacts.glob("sparse-*.bin"))
    assert len(copied) == 8
    for path in copied:
        st = path.stat()
        assert st.st_size == (190 << 20) + 4  # the file reads the same as in the sandbox ...
        assert st.st_blocks * 512 < 1 << 20  # ... and its holes stayed holes
        with path.open("rb") as handle:
            assert handle.read(4) == b"head"
            handle.seek(190 << 20)
            assert handle.read() == b"tail"


def test_sandbox_code_runs_under_the_configured_rlimits(home: Path) -> None:
    """The stage sets the rlimits on itself (not in a preexec_fn), and the code it starts inherits them."""
    settings = make_settings(home, memory_mb=300, cpu_seconds=77, max_file_mb=3)
    code = (
        "import resource as r\n"
        "print(*(r.getrlimit(getattr(r, n)) for n in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_CORE')))"
    )
    mib = 1024 * 1024
    assert run_turn(settings, code) == f"({812 * mib}, {812 * mib}) (77, 82) ({3 * mib}, {3 * mib}) (0, 0)"
