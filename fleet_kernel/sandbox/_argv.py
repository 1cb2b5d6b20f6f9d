"""The command line that starts a ``local`` sandbox: ``_stage.py`` around bubblewrap around the runtime.

``sandbox_argv`` is what a sandbox runs; ``bwrap_argv`` is bubblewrap's part (namespaces, the read-only
system, the support folder's files, private ``/tmp`` and ``/dev/shm``, the workspace copy at ``/workspace``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fleet_kernel.config import SandboxLimits
from fleet_kernel.sandbox import _pyfarm
from fleet_kernel.sandbox._support import ETC_BINDS, SANDBOX_RUNTIME, python_paths, support_dir

STAGE = Path(__file__).with_name("_stage.py")


@functools.cache
def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def _supports_disable_userns() -> bool:
    bwrap = bwrap_path()
    if bwrap is None:
        return False
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False).stdout  # noqa: S603 - bwrap --help
    return "--disable-userns" in help_text


def tuning_env() -> dict[str, str]:
    """Fewer reserved arenas and BLAS threads: both cost address space, which RLIMIT_AS counts."""
    threads = str(min(4, os.cpu_count() or 1))
    return {
        "MALLOC_ARENA_MAX": "2",
        "OPENBLAS_NUM_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


def _env_args() -> list[str]:
    env = {**tuning_env(), "XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/.matplotlib"}  # not /workspace  # noqa: S108 - the sandbox's own private /tmp
    return [arg for name, value in env.items() for arg in ("--setenv", name, value)]


def bwrap_argv(
    limits: SandboxLimits, command: list[str], *, seccomp_fd: int | None, farm: _pyfarm.Farm | None = None
) -> list[str]:
    """The bubblewrap command line around ``command`` (which runs as uid 65534 in /workspace).

    Run by ``_stage.py``, which has mounted the workspace copy and the Python install in the support folder.
    """
    mib = 1024 * 1024
    argv = [
        bwrap_path() or "bwrap",
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
    support = support_dir()
    argv += ["--ro-bind", str(support / "etc"), "/etc", "--ro-bind", str(support / "runtime.pyc"), SANDBOX_RUNTIME]
    for name in ETC_BINDS:
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
    for n, prefix in enumerate(python_paths()):  # after /tmp's tmpfs, which would hide a venv under /tmp
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
    support = support_dir()
    farm = _pyfarm.python_farm(python_paths())
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
    for n, prefix in enumerate(python_paths()):
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
