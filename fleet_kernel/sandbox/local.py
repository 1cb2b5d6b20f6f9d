"""The ``local`` sandbox: a CPython worker running ``runtime.py`` under bubblewrap; and ``unsafe-local``.

``local`` (the default on Linux): no network, no host files but the Python install (read-only), a
fresh ``/tmp``, a quota-limited copy of the session workspace at ``/workspace`` (``_stage.py`` mounts it
and copies changes back), uid 65534 without capabilities (mapped to the host user, or to a uid of its
own when the host is root), a seccomp filter, rlimits and, where the hierarchy is writable, a cgroup
for memory and process count.
``unsafe-local`` runs the same runtime as a plain subprocess of the host user: explicit opt-in only.
This module starts and stops those processes (``ProcessSession``) and probes bubblewrap; the backend
objects that turns use, over this and the pool (``pool.py``), are ``local_backend.py``'s.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import json
import logging
import os
import py_compile
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Literal

from fleet_kernel.config import SandboxLimits
from fleet_kernel.sandbox import _confine, _pyfarm, _slots
from fleet_kernel.sandbox._protocol import PipeSession, SessionClosed
from fleet_kernel.workspace import Unsaved, note_unsaved

logger = logging.getLogger(__name__)

RUNTIME = Path(__file__).with_name("runtime.py")
STAGE = Path(__file__).with_name("_stage.py")
STOP_TIMEOUT_S = 60.0  # for the copy-back of a stopped sandbox's workspace
SANDBOX_RUNTIME = "/run/fleet/runtime.pyc"
START_TIMEOUT_S = 10.0
SLOT_WAIT_S = 30.0  # a sandbox a turn starts beyond its reserved one (a child RLM's) waits this long for a slot
_ETC_BINDS = ("fonts",)  # fontconfig, for matplotlib and friends
_LIVE: weakref.WeakSet[ProcessSession] = weakref.WeakSet()  # killed at exit, so no cgroup outlives us


@functools.cache
def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def _supports_disable_userns() -> bool:
    bwrap = _bwrap_path()
    if bwrap is None:
        return False
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False).stdout  # noqa: S603 - bwrap --help
    return "--disable-userns" in help_text


def _tuning_env() -> dict[str, str]:
    """Fewer reserved arenas and BLAS threads: both cost address space, which RLIMIT_AS counts."""
    threads = str(min(4, os.cpu_count() or 1))
    return {
        "MALLOC_ARENA_MAX": "2",
        "OPENBLAS_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


def _env_args() -> list[str]:
    env = {**_tuning_env(), "XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/.matplotlib"}  # not /workspace  # noqa: S108 - the sandbox's own private /tmp
    return [arg for name, value in env.items() for arg in ("--setenv", name, value)]


def _python_paths() -> list[str]:
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


def _support_dir() -> Path:
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
    for mount_point in ("workspace", *(f"ro/{n}" for n in range(len(_python_paths())))):
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
    for name in _ETC_BINDS:
        (path / name).mkdir()  # mount points for the host's own (harmless) config, bound read-only


def bwrap_argv(
    limits: SandboxLimits, command: list[str], *, seccomp_fd: int | None, farm: _pyfarm.Farm | None = None
) -> list[str]:
    """The bubblewrap command line around ``command`` (which runs as uid 65534 in /workspace).

    Run by ``_stage.py``, which has mounted the workspace copy and the Python install in the support folder.
    """
    mib = 1024 * 1024
    argv = [
        _bwrap_path() or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/workspace",
        "--setenv",
        "LANG",
        "C.UTF-8",
        *_env_args(),
        "--hostname",
        "sandbox",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/", name)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    support = _support_dir()
    argv += ["--ro-bind", str(support / "etc"), "/etc", "--ro-bind", str(support / "runtime.pyc"), SANDBOX_RUNTIME]
    for name in _ETC_BINDS:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(64 * mib),
        "--tmpfs",
        "/dev/shm",  # noqa: S108 - a private tmpfs in the sandbox
        "--size",
        str(max(64, limits.memory_mb // 4) * mib),
        "--tmpfs",
        "/tmp",  # noqa: S108 - a private tmpfs in the sandbox
        "--bind",
        str(support / "workspace"),
        "/workspace",
        "--chdir",
        "/workspace",
    ]
    for n, prefix in enumerate(_python_paths()):  # after /tmp's tmpfs, which would hide a venv under /tmp
        argv += ["--ro-bind", str(support / "ro" / str(n)), farm.targets[n] if farm else prefix]
    if farm is not None:  # an interpreter built with an absolute RUNPATH still finds its libpython
        libs = [
            f"{target}/lib"
            for prefix, target in zip(farm.prefixes, farm.targets, strict=True)
            if any(Path(prefix, "lib").glob("libpython*"))
        ]
        if libs:
            argv += ["--setenv", "LD_LIBRARY_PATH", ":".join(libs)]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if _supports_disable_userns():
        argv.append("--disable-userns")
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, "--", *command]


def sandbox_argv(
    workspace: Path | None,
    limits: SandboxLimits,
    command: list[str],
    *,
    seccomp_fd: int | None,
    join_fds: list[int],
    adopt_fd: int | None = None,
    saved_fd: int | None = None,
    rlimits: list[tuple[int, tuple[int, int]]] | None = None,
) -> list[str]:
    """``_stage.py`` (quota'd workspace copy, neutral mounts, own uid as root) around bubblewrap around ``command``.

    Without ``workspace``, ``adopt_fd`` is the stage's end of a socket that names the workspace later (pool.py).
    The stage sets ``rlimits`` on itself first thing: set in a ``preexec_fn`` instead, they would make
    ``Popen`` take the import lock and logging's lock around the fork (``PyOS_BeforeFork``), which deadlocks
    a pool thread against another thread that imports while a handler is collected.
    """
    support = _support_dir()
    farm = _pyfarm.python_farm(_python_paths())
    if farm is not None and command[:1] == [sys.executable]:
        command = [farm.neutral(sys.executable), *command[1:]]
    where = ["--workspace", str(workspace.absolute())] if workspace is not None else ["--adopt-fd", str(adopt_fd)]
    argv = [
        sys.executable,
        "-I",
        "-B",
        "-S",  # the stage is stdlib only: no site-packages to scan (~15 ms of CPU a start, in a venv)
        str(STAGE),
        *where,
        "--mount",
        str(support / "workspace"),
        "--size",
        str(limits.workspace_mb * 1024 * 1024),
        "--inodes",
        str(limits.workspace_files + 1),
    ]  # + the root folder
    for n, prefix in enumerate(_python_paths()):
        argv += ["--expose", f"{farm.sources[n] if farm else prefix}={support / 'ro' / str(n)}"]
    for fd in join_fds:
        argv += ["--join-fd", str(fd)]
    if seccomp_fd is not None:
        argv += ["--keep-fd", str(seccomp_fd)]
    if saved_fd is not None:
        argv += ["--saved-fd", str(saved_fd)]
    for which, (soft, hard) in rlimits or []:
        argv += ["--rlimit", f"{which}:{soft}:{hard}"]
    return [*argv, "--", *bwrap_argv(limits, command, seccomp_fd=seccomp_fd, farm=farm)]


def _userns_hint() -> str:
    apparmor = "kernel.apparmor_restrict_unprivileged_userns"
    checks = {
        "/proc/sys/kernel/unprivileged_userns_clone": ("0", "sysctl -w kernel.unprivileged_userns_clone=1"),
        "/proc/sys/user/max_user_namespaces": ("0", "sysctl -w user.max_user_namespaces=15000"),
        "/proc/sys/" + apparmor.replace(".", "/"): (
            "1",
            f"install the bwrap AppArmor profile, or sysctl -w {apparmor}=0",
        ),
    }
    for path, (blocked, fix) in checks.items():
        with contextlib.suppress(OSError):
            if Path(path).read_text().strip() == blocked:
                return f"unprivileged user namespaces are disabled: {fix}"
    return (
        "bubblewrap cannot create namespaces here (inside a container, run it with --privileged or a seccomp "
        "profile that allows unshare/clone of user namespaces)"
    )


# what probe_bwrap says when bubblewrap cannot run on this machine at all (not a fault to report)
CANNOT_RUN_HERE = (
    "bubblewrap needs Linux",
    "bubblewrap is not installed",
    "unprivileged user namespaces are disabled",
    "bubblewrap cannot create namespaces here",
)
_probe_lock = threading.Lock()
_probe_passed = False
_probe_failures: set[str] = set()  # reasons already logged


def probe_bwrap() -> str | None:
    """None when the ``local`` sandbox works here; else why not and what to install or set.

    One probe at a time (a kernel's warm-up and its first turn ask together), and only a pass is kept: a
    probe that timed out on a loaded machine is tried again by the next turn instead of moving every later
    turn to another backend.
    """
    global _probe_passed
    if _probe_passed:
        return None
    with _probe_lock:
        if not _probe_passed:
            reason = _probe_bwrap_once()
            if reason is not None:
                if reason not in _probe_failures:  # once per reason: a machine without it asks every turn
                    _probe_failures.add(reason)
                    logger.warning("the local sandbox cannot start here: %s", reason)
                return reason
            _probe_passed = True
    return None


def _probe_bwrap_once() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if _bwrap_path() is None:
        return "bubblewrap is not installed: apt-get install bubblewrap (or dnf/pacman install bubblewrap)"
    seccomp = _confine.seccomp_fd()
    with tempfile.TemporaryDirectory(prefix="fleet-probe-") as workspace:
        command = [sys.executable, "-I", "-S", "-c", "pass"]
        argv = sandbox_argv(Path(workspace), SandboxLimits(), command, seccomp_fd=seccomp, join_fds=[])
        try:
            done = subprocess.run(  # noqa: S603 - the sandbox argv built here
                argv,
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
                pass_fds=() if seccomp is None else (seccomp,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap failed to run: {exc}"
        finally:
            if seccomp is not None:
                os.close(seccomp)
    if done.returncode == 0:
        return None
    error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
    if (unreachable := _temp_unreachable()) is not None:
        return f"{unreachable} (bwrap: {error})"
    if any(s in error for s in ("namespace", "uid map", "Operation not permitted", "setting up")):
        return f"{_userns_hint()} (bwrap: {error})"
    return f"bubblewrap cannot start the sandbox: {error}"


def _temp_unreachable() -> str | None:
    """Why the sandbox's own uid (root's sandboxes run as one) cannot reach the support folder; else None.

    The support folder is in the temp folder: a ``TMPDIR`` below a folder others may not enter (``/root``)
    stops every sandbox, whatever bubblewrap can do.
    """
    if os.geteuid() != 0:
        return None  # the sandbox's uid is this user's own, mapped: it enters what the user enters
    temp = Path(tempfile.gettempdir()).resolve()
    for folder in (*reversed(temp.parents), temp):
        with contextlib.suppress(OSError):
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                return (
                    f"the sandbox's user cannot enter {folder} (mode {stat.filemode(mode)}), which holds the temp "
                    f"folder {temp} where Fleet keeps the sandbox's files: set TMPDIR to a folder every user may "
                    f"enter, such as /tmp, or `chmod o+x {folder}`"
                )
    return None


def cannot_run_here(reason: str) -> bool:
    """True when ``reason`` (from ``probe_bwrap``) means bubblewrap cannot run on this machine at all, so the
    default backend may be another one; any other failure is this machine's to fix, and is reported."""
    return reason.startswith(CANNOT_RUN_HERE)


def _kernel_counts_nproc_per_userns() -> bool:
    """Since Linux 5.14 RLIMIT_NPROC set inside a user namespace counts only that namespace's processes."""
    with contextlib.suppress(ValueError):
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
        return (major, minor) >= (5, 14)
    return False


def busy_message(cap: int) -> str:
    """What a user reads when the machine runs as many sandboxes as the cap allows."""
    return (
        f"{_slots.held(cap)} sandboxes are running, the cap [sandbox] max_sandboxes is {cap}; "
        "wait for a turn to end or raise it in fleet.toml"
    )


class SlotsFull(SessionClosed):
    """No slot freed under ``[sandbox] max_sandboxes`` in time; the message says so."""


class ProcessSession(PipeSession):
    """One CPython worker (under bubblewrap unless ``isolated`` is false) running the runtime.

    Started without a workspace (isolated only), it waits, ready, until ``adopt`` names one (the pool).
    Each holds a slot under ``[sandbox] max_sandboxes`` (``_slots``) from its start until it is reaped:
    its turn's reserved one when free, else a free one, waited for up to ``slot_wait_s``.
    """

    start_timeout_s = START_TIMEOUT_S
    slot_wait_s = SLOT_WAIT_S

    def __init__(self, workspace: Path | None, limits: SandboxLimits, *, isolated: bool) -> None:
        super().__init__()
        self._workspace, self._limits, self._isolated = workspace, limits, isolated
        self._adopt: socket.socket | None = None  # our end of the stage's adopt socket, until adopted
        self._saved: int | None = None  # the stage says "saved" here once the workspace is copied back
        self._stopping = False  # kill() has begun: no longer alive, whatever is left to reap
        self._slot: _slots.Slot | None = None

    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    def alive(self) -> bool:
        return not self._stopping and self._process is not None and self._process.poll() is None

    def healthy(self) -> bool:
        """Alive, and its channel neither ended nor holds a message nobody asked for (a waiting sandbox says
        nothing): the runtime killed inside a live stage shows as the end of its stdout (see ``_stage.py``)."""
        if not self.alive() or self._eof or self._buffer:
            return False
        poller = select.poll()
        poller.register(self._stdout_fd, select.POLLIN)
        return not poller.poll(0)

    def adopt(self, workspace: Path) -> None:
        """Bind this pre-started sandbox to ``workspace``: its files are copied in before this returns."""
        channel = self._adopt
        if channel is None or self._workspace is not None:
            raise SessionClosed("is not waiting for a workspace")
        try:
            channel.settimeout(STOP_TIMEOUT_S)  # a copy-in of a large workspace
            channel.sendall(str(workspace.absolute()).encode() + b"\n")
            answer = channel.makefile("rb").readline().decode(errors="replace").strip()
        except OSError as exc:
            answer = f"error {exc}"
        if answer != "ok":
            self.kill()
            raise SessionClosed(f"could not take the workspace: {answer or 'the sandbox exited'}")
        self._workspace, self._adopt = workspace, None
        channel.close()
        reserved = _slots.claim(str(workspace.absolute()))
        if reserved is not None:  # run on the turn's slot; the pool's own frees, for its refill
            own, self._slot = self._slot, reserved
            if own is not None:
                own.release()

    def _take_slot(self) -> _slots.Slot:
        """The turn's reserved slot, else a free one (waiting up to ``slot_wait_s``, or until killed)."""
        cap = self._limits.sandbox_cap
        key = str(self._workspace.absolute()) if self._workspace is not None else None
        slot = _slots.claim(key) if key is not None else None
        slot = slot or _slots.acquire(cap, wait_s=self.slot_wait_s, stop=lambda: self._stopping)
        if self._stopping:
            if slot is not None:
                slot.release()
            raise SessionClosed("was stopped before it started")
        if slot is None:
            raise SlotsFull(busy_message(cap))
        return slot

    def start(self, *, wait: bool = True) -> None:
        """Start the sandbox and (``wait``) wait until it is ready; else call ``wait_ready`` later."""
        limits = self._limits
        self._slot = self._slot or self._take_slot()
        options = ["--max-output-bytes", str(limits.max_output_bytes)]
        self._cgroup = _confine.Cgroup.create(limits.memory_mb, limits.max_processes + 16, limits.cpu_cores)
        join_fds = self._cgroup.join_fds() if self._cgroup else []
        seccomp = _confine.seccomp_fd() if self._isolated else None
        rlimits = _confine.rlimits(limits.memory_mb, limits.cpu_seconds, limits.max_file_mb)
        if self._isolated:
            options += ["--reap", "1"]
            if _kernel_counts_nproc_per_userns():
                options += ["--nproc", str(limits.max_processes)]
            command = [sys.executable, "-I", "-B", SANDBOX_RUNTIME, *options]
            stage_end = None
            if self._workspace is None:
                self._adopt, stage_end = socket.socketpair()
                join_fds.append(stage_end.detach())  # passed on and closed here like the cgroup fds
            self._saved, saved_end = os.pipe()
            argv = sandbox_argv(
                self._workspace,
                limits,
                command,
                seccomp_fd=seccomp,
                join_fds=join_fds[:-1] if stage_end is not None else join_fds,
                adopt_fd=join_fds[-1] if stage_end is not None else None,
                saved_fd=saved_end,
                rlimits=rlimits,
            )
            join_fds.append(saved_end)  # passed on and closed here like the cgroup fds
            env, cwd, preexec = {}, None, None  # _stage.py sets the rlimits, and joins the cgroup after its copy
        else:
            prefix, preexec = _confine.child_start(join_fds, rlimits)
            argv = [*prefix, sys.executable, "-I", "-B", str(_support_dir() / "runtime.pyc"), *options]
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(self._workspace),
                "LANG": "C.UTF-8",
                **_tuning_env(),
            }
            cwd = str(self._workspace)
        passed = [*([] if seccomp is None else [seccomp]), *(join_fds if preexec is None else [])]
        try:
            process = subprocess.Popen(  # noqa: S603 - the sandbox argv built here
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                bufsize=1 << 16,
                pass_fds=passed,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            self.kill()
            raise SessionClosed(f"could not be started: {exc}") from exc
        finally:
            for fd in [*join_fds, *([] if seccomp is None else [seccomp])]:
                os.close(fd)
        _LIVE.add(self)
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError, AttributeError):  # fewer round trips for big messages
                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)  # type: ignore[union-attr]
        self._attach(process, wait=False)
        if self._stopping:  # killed while it started (a cancelled turn): the kill may have missed the process
            self.kill()
            raise SessionClosed("was stopped while it started")
        if wait:
            self.wait_ready()

    def kill(self) -> None:
        """Stop the sandbox; ``_stage.py`` then copies the workspace back, which this waits for.

        The stage's exit after that (the teardown of its mount namespace, ~3 ms) and the cleanup here
        (reaping, the cgroup) run on a thread, off the turn's path.
        """
        self._stopping = True
        waiting = self._adopt is not None  # never adopted (or adopting now): nothing to save, no copy-back to wait for
        if self._adopt is not None:
            with contextlib.suppress(OSError):
                self._adopt.shutdown(socket.SHUT_RDWR)  # wakes an ``adopt`` blocked on the stage's answer
            self._adopt.close()
            self._adopt = None
        process, saved, self._saved = self._process, self._saved, None
        try:
            if process is not None and self._isolated and not waiting:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    process.send_signal(signal.SIGTERM)
                said = _said_saved(saved, STOP_TIMEOUT_S) if saved is not None else None
                if said is not None:
                    if isinstance(said, Unsaved) and self._workspace is not None:
                        note_unsaved(self._workspace, said)
                    threading.Thread(target=self._reap, name="fleet-sandbox-stop", daemon=True).start()
                    return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=STOP_TIMEOUT_S)
            self._reap()
        finally:
            if saved is not None:
                os.close(saved)

    def _reap(self) -> None:
        """End what is left of the process and its cgroup, then free its slot."""
        super().kill()
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def _explain_death(self) -> str:
        limits = self._limits
        code = self._exit_code()
        number = -code if code is not None and code < 0 else code - 128 if code and code > 128 else 0
        if self._cgroup is not None and self._cgroup.oom_killed():
            reason = f"was killed because it ran out of memory (limit {limits.memory_mb} MB)"
        elif number == signal.SIGXCPU:
            reason = f"was stopped because it used up its CPU time ({limits.cpu_seconds} s)"
        elif number == signal.SIGKILL:
            reason = "was killed (SIGKILL; out of memory?)"
        elif number == signal.SIGSEGV:
            reason = "crashed with a segmentation fault (SIGSEGV)"
        elif number in set(signal.Signals):
            reason = f"was killed by {signal.Signals(number).name}"
        else:
            reason = f"exited unexpectedly (status {code})"
        stderr = self._stderr_tail.decode("utf-8", "replace").strip()  # bwrap errors, Python's fatal errors
        if "Fatal Python error" in stderr:
            reason += ":\n" + "\n".join(stderr[stderr.index("Fatal Python error") :].splitlines()[:12])
        elif stderr:
            reason += ":\n" + "\n".join(stderr.splitlines()[-5:])
        return reason


def _said_saved(fd: int, timeout: float) -> Unsaved | Literal[True] | None:
    """What the stage said on ``fd`` within ``timeout``: True (all saved), what it could not save
    (``_stage.saved_line``), or None when it exited without a word.

    ``poll``, not ``select``: a server's descriptors can number above select's 1024.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    line = os.read(fd, 1 << 16) if poller.poll(timeout * 1000) else b""
    if line.startswith(b"saved"):
        return True
    if not line.startswith(b"unsaved "):
        return None
    try:
        report = json.loads(line[len(b"unsaved ") :])
        files = [(str(path), int(number), str(reason)) for path, number, reason in report["files"]]
        return Unsaved(int(report["count"]), files)
    except (ValueError, KeyError, TypeError):
        return Unsaved(1, [(".", 0, "the sandbox's copy-back sent a report that could not be read")])


@atexit.register
def _kill_live_sessions() -> None:
    for session in list(_LIVE):
        session.kill()
