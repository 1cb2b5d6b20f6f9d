"""Kernel-level limits for the ``local`` sandbox worker: a seccomp filter, rlimits and a cgroup.

bubblewrap gives the namespaces; these bound what the worker can do inside them. The seccomp
program is built once per process with ``pyseccomp`` and handed to ``bwrap --seccomp FD``. The
cgroup is optional (it needs a writable hierarchy, e.g. root or delegation) but it is what stops a
fork bomb when the host user is root, since root ignores ``RLIMIT_NPROC``, and what keeps busy
sandbox processes to their share of the machine's cores (``cpu_cores``), where the CPU controller
is available.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import resource
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
# Syscalls sandboxed code never needs; they are the usual ways out of a namespace sandbox.
_DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "unshare",
    "setns",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    # Symbolic links: one left in the workspace points wherever the code likes on the host, and the host
    # follows it (preparing the next turn, scanning artifacts, saving an upload, Deno in Pyodide).
    "symlink",
    "symlinkat",
)
_CLONE_NEW_FLAGS = (
    0x00000080,
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)  # CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET


@functools.cache
def seccomp_program() -> bytes | None:
    """The BPF program for ``bwrap --seccomp``, or None when libseccomp is unavailable (logged)."""
    try:
        import pyseccomp as sc  # noqa: PLC0415 - needs libseccomp.so, which may be missing: a logged fallback, not an import error
    except Exception as exc:  # ImportError, or RuntimeError when libseccomp.so is missing
        logger.warning("seccomp filter disabled (%s); install libseccomp2 and pyseccomp", exc)
        return None
    flt = sc.SyscallFilter(sc.ALLOW)
    for name in _DENIED:
        with contextlib.suppress(Exception):  # not every syscall exists on every architecture
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
    for flag in _CLONE_NEW_FLAGS:
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    with contextlib.suppress(Exception):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags are behind a pointer: make libc use clone
    # Only Unix sockets: asyncio and multiprocessing need socketpair, nothing needs the network.
    flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()


def seccomp_fd() -> int | None:
    """A fresh readable fd holding the program (bwrap reads it to the end), or None."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("fleet-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def rlimits(memory_mb: int, cpu_seconds: int, max_file_mb: int) -> list[tuple[int, tuple[int, int]]]:
    """Per-process limits. Address space is not memory (stacks, malloc arenas and BLAS buffers reserve
    without using it), hence the 512 MiB allowance; the cgroup, where there is one, bounds real memory."""
    mib = 1024 * 1024
    address_space = (memory_mb + 512) * mib
    return [
        (resource.RLIMIT_AS, (address_space, address_space)),  # a clean MemoryError for huge allocations
        (resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5)),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_FSIZE, (max_file_mb * mib, max_file_mb * mib)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


class Cgroup:
    """One worker's cgroup (v1 memory+pids, or v2), joined by the child before it execs bwrap."""

    def __init__(self, dirs: list[Path], memory_dir: Path) -> None:
        self.dirs, self._memory_dir = dirs, memory_dir

    @classmethod
    def create(cls, memory_mb: int, max_tasks: int, cpu_cores: float | None = None) -> Cgroup | None:
        """A fresh cgroup with these limits, or None when no writable hierarchy exists here.

        Memory and process count are required; the CPU cap is applied where the controller can be used.
        """
        name = f"worker-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        limit = str(memory_mb * 1024 * 1024)
        quota = str(max(1000, int((cpu_cores or 0) * CPU_PERIOD_US)))
        optional: dict[Path, str] = {}  # written if the kernel lets us; a failure leaves that limit out
        if (CGROUP_ROOT / "memory" / "cgroup.procs").exists() and (CGROUP_ROOT / "pids" / "cgroup.procs").exists():
            cpu_root = CGROUP_ROOT / "cpu"
            with_cpu = bool(cpu_cores) and (cpu_root / "cgroup.procs").exists() and os.access(cpu_root, os.W_OK)
            _sweep(CGROUP_ROOT / "memory" / "fleet", CGROUP_ROOT / "pids" / "fleet", cpu_root / "fleet")
            memory, pids, cpu = (CGROUP_ROOT / c / "fleet" / name for c in ("memory", "pids", "cpu"))
            files = {memory / "memory.limit_in_bytes": limit, pids / "pids.max": str(max_tasks)}
            optional[memory / "memory.memsw.limit_in_bytes"] = limit
            if with_cpu:
                files |= {cpu / "cpu.cfs_period_us": str(CPU_PERIOD_US), cpu / "cpu.cfs_quota_us": quota}
            group = cls([memory, pids, *([cpu] if with_cpu else [])], memory)
        elif (CGROUP_ROOT / "cgroup.controllers").exists():
            parent = CGROUP_ROOT / "fleet"
            _sweep(parent)
            group = cls([parent / name], parent / name)
            files = {
                CGROUP_ROOT / "cgroup.subtree_control": "+memory +pids",
                parent / "cgroup.subtree_control": "+memory +pids",
                parent / name / "memory.max": limit,
                parent / name / "pids.max": str(max_tasks),
            }
            optional[parent / name / "memory.swap.max"] = "0"
            if cpu_cores:
                optional |= {
                    CGROUP_ROOT / "cgroup.subtree_control": "+cpu",
                    parent / "cgroup.subtree_control": "+cpu",
                    parent / name / "cpu.max": f"{quota} {CPU_PERIOD_US}",
                }
        else:
            return None
        try:
            for path in group.dirs:
                path.mkdir(parents=True, exist_ok=True)
            for path, value in files.items():
                if path.name == "cgroup.subtree_control" and not path.exists():
                    raise OSError(f"{path} missing")
                path.write_text(value)
        except OSError as exc:
            logger.debug("no cgroup for the sandbox worker: %s", exc)
            group.remove()
            return None
        for path, value in optional.items():
            try:
                path.write_text(value)
            except OSError as exc:  # no swap accounting, or no CPU controller delegated here
                logger.debug("cgroup limit %s left out: %s", path.name, exc)
        return group

    def join_fds(self) -> list[int]:
        """Open ``cgroup.procs`` files; the child writes "0" (itself) to each before it execs."""
        return [os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for path in self.dirs]

    def oom_killed(self) -> bool:
        for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
            with contextlib.suppress(OSError, ValueError):
                for line in (self._memory_dir / name).read_text().splitlines():
                    field, _, count = line.partition(" ")
                    if field == key and int(count) > 0:
                        return True
        return False

    def remove(self) -> None:
        """Kill whatever is left inside, then delete the cgroup directories."""
        for path in self.dirs:
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 2
            while path.exists():
                with contextlib.suppress(OSError, ValueError):
                    for pid in (path / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    path.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        logger.warning("could not remove cgroup %s", path)
                        break
                    time.sleep(0.01)


@functools.cache
def _sweep(*parents: Path) -> None:
    """Once per process: remove cgroups left behind by Fleet processes that died without cleaning up."""
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.glob("worker-*"):
                pid = child.name.split("-")[1]
                if pid.isdigit() and not Path("/proc", pid).exists():
                    Cgroup([child], child).remove()


_PRLIMIT_OPTIONS = {
    resource.RLIMIT_AS: "--as",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_CORE: "--core",
    resource.RLIMIT_NPROC: "--nproc",
    resource.RLIMIT_NOFILE: "--nofile",
}
# Arguments: the cgroup fds to write "0" to (joining it), "--", then the command to exec. bash, not sh:
# dash redirects only to single-digit fds.
_JOIN_THEN_EXEC = 'while [ "$1" != -- ]; do printf 0 >&"$1"; shift; done; shift; exec "$@"'


def launcher(join_fds: list[int], limits: list[tuple[int, tuple[int, int]]]) -> list[str] | None:
    """An argv prefix that joins the cgroup (writing to ``join_fds``) and sets ``limits`` in the child by exec
    (``bash``, then util-linux's ``prlimit``), instead of a ``preexec_fn``: with one, ``Popen`` holds the import
    lock and logging's locks around the fork, which deadlocks against a thread that imports while a handler
    is collected. None without them (then ``preexec`` is the way)."""
    prlimit, bash = shutil.which("prlimit"), shutil.which("bash")
    if prlimit is None or bash is None or any(which not in _PRLIMIT_OPTIONS for which, _ in limits):
        return None
    with_limits = [prlimit, *(f"{_PRLIMIT_OPTIONS[which]}={soft}:{hard}" for which, (soft, hard) in limits), "--"]
    if not join_fds:
        return with_limits
    return [bash, "-c", _JOIN_THEN_EXEC, "bash", *(str(fd) for fd in join_fds), "--", *with_limits]


def child_start(
    join_fds: list[int], limits: list[tuple[int, tuple[int, int]]]
) -> tuple[list[str], Callable[[], None] | None]:
    """What goes before the command (``launcher``), or else the ``preexec_fn`` that does the same."""
    prefix = launcher(join_fds, limits)
    return (prefix, None) if prefix is not None else ([], preexec(join_fds, limits))


def preexec(join_fds: list[int], limits: list[tuple[int, tuple[int, int]]]) -> Callable[[], None]:
    """Runs in the forked child before exec: join the cgroup, then lower the rlimits (no allocation)."""

    def apply() -> None:
        for fd in join_fds:
            os.write(fd, b"0")
        for which, value in limits:
            resource.setrlimit(which, value)

    return apply
