"""The support folder bound into every ``local`` sandbox: the compiled runtime, a tiny ``/etc`` and mount points.

One folder per process in the temp folder (``fleet-sandbox-<pid>-...``), held by a lock on its ``.owner``
file for the life of the process; folders that killed processes left behind are swept at the first start.
The host's Python install (interpreter prefix, venv) is what the sandbox sees of the host's files, read-only.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import py_compile
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

RUNTIME = Path(__file__).with_name("runtime.py")
SANDBOX_RUNTIME = "/run/fleet/runtime.pyc"
ETC_BINDS = ("fonts",)  # fontconfig, for matplotlib and friends


def python_paths() -> list[str]:
    """Directories the worker's Python needs (interpreter prefix, venv), outside /usr, outermost first."""
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        str(Path(os.path.realpath(sys.executable)).parent.parent),
    }
    paths: set[str] = set()
    for path in candidates:
        paths |= {os.path.abspath(path), os.path.realpath(path)}
    kept: list[str] = []
    for path in sorted(paths, key=len):
        if path in ("/", str(Path.home())) or path.startswith("/usr/") or path == "/usr":
            continue  # never expose the whole root or home; /usr is bound anyway
        if not any(path.startswith(outer.rstrip("/") + "/") for outer in kept):
            kept.append(path)
    return kept


_support: list[Path] = []  # this process's support directory, once made
_held: list[int] = []  # the descriptors holding each support folder's owner lock
SUPPORT_PREFIX = "fleet-sandbox-"
OWNER_LOCK = ".owner"
_SUPPORT_NAME = re.compile(rf"{SUPPORT_PREFIX}(\d+)-\w+")


def support_dir() -> Path:
    """Per-process files bound into the sandbox: the compiled runtime (saves ~10 ms a start) and ``etc/``.

    Made again if it vanished (tmp cleaners age out files of long-running servers).
    """
    if _support and (_support[-1] / "runtime.pyc").exists():
        return _support[-1]
    if not _support:
        sweep_support_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"{SUPPORT_PREFIX}{os.getpid()}-"))
    atexit.register(shutil.rmtree, path, True)
    _hold(path)
    py_compile.compile(str(RUNTIME), cfile=str(path / "runtime.pyc"), dfile=SANDBOX_RUNTIME, doraise=True)
    _write_etc(path / "etc")
    for mount_point in ("workspace", *(f"ro/{n}" for n in range(len(python_paths())))):
        (path / mount_point).mkdir(parents=True)  # only ever mounted on in a sandbox's own mount namespace
    path.chmod(0o755)
    _support.append(path)
    return path


def _hold(path: Path) -> None:
    """Lock ``path/.owner`` for the life of this process: the OS drops the lock when the process dies, however."""
    fd = os.open(path / OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held.append(fd)  # never closed: closing would release the lock


def sweep_support_dirs() -> list[Path]:
    """Remove the support folders that killed processes of this user left in the temp folder; returns them.

    A folder is stale when the process named in it (``fleet-sandbox-<pid>-...``) is gone and nobody holds its
    ``.owner`` lock (a process of the same pid in another PID namespace that shares the temp folder still does).
    """
    removed = []
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            match = _SUPPORT_NAME.fullmatch(entry.name)
            if match is None or _alive(int(match[1])):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not _locked(Path(entry.path)):
                    shutil.rmtree(entry.path)
                    removed.append(Path(entry.path))
    if removed:
        logger.info("removed %d support folders of dead Fleet processes from %s", len(removed), tempfile.gettempdir())
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: alive
        return True
    return True


def _locked(path: Path) -> bool:
    """True when a live process holds ``path/.owner`` (a folder without one is not ours to judge: kept)."""
    try:
        fd = os.open(path / OWNER_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _write_etc(path: Path) -> None:
    """A tiny /etc: who uid 65534 is, localhost, and the loader cache; nothing of the host's."""
    path.mkdir()
    files = {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:65534:65534:sandbox:/workspace:/bin/sh\n",
        "group": "root:x:0:\nsandbox:x:65534:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }
    for name, text in files.items():
        (path / name).write_text(text)
    with contextlib.suppress(OSError):
        shutil.copyfile("/etc/ld.so.cache", path / "ld.so.cache")
    for name in ETC_BINDS:
        (path / name).mkdir()  # mount points for the host's own (harmless) config, bound read-only
