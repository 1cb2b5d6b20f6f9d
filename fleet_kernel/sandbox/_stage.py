"""Runs bubblewrap on a private, size- and file-limited copy of a session workspace (stdlib only).

Started by the host as ``python -I -B -S _stage.py OPTIONS -- BWRAP_ARGV``. In a mount namespace of its own
(plus a user namespace when the host is not root) it mounts a tmpfs with ``size=`` and ``nr_inodes=`` (the
``[sandbox] workspace_mb`` and ``workspace_files`` quota), copies the host workspace into it, binds the
Python install read-only at neutral mount points, and runs bubblewrap, which binds that tmpfs at
``/workspace``. When bubblewrap ends (or this process gets SIGTERM, which kills it), the changes are
copied back. Sandbox code therefore never touches a host path: it sees a filesystem whose root is the
workspace (so ``/proc/self/mountinfo`` names no host folder), and a full workspace is ``ENOSPC``.

When the host is root, bubblewrap runs as a uid of its own (``UID_BASE`` + this process's pid), so the
sandbox has no more access to the read-only bound files than any other unprivileged user, cannot be
mistaken for a real account, and ``RLIMIT_NPROC`` bounds it.

Every sandbox start runs this file in a fresh interpreter, so it imports only what it must: its command line
is read by ``Options``, bubblewrap is started by ``Child`` and a leftover's name is matched by hand (argparse,
subprocess, re and json would add ~25 ms of CPU to each start, more than the interpreter's own ~12 ms).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import itertools
import os
import resource
import signal
import stat
import sys
from collections.abc import Callable

UID_BASE = 0x7F000000  # far above real accounts and the usual subordinate-uid ranges
MS_NOSUID, MS_NODEV, MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 1, 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
_CHUNK = 1 << 20
MAX_DEPTH = 64  # folders deeper than this are not copied (os.walk recurses; paths stay far below PATH_MAX)

Snapshot = dict[str, tuple[int, int, int]]  # relative path -> (inode, size, mtime_ns) in the tmpfs after copy-in
# A file is written under a short random name and renamed over its own, so any name up to NAME_MAX fits and
# a temporary a crash left behind never blocks a later copy. Such leftovers (and the ``.NAME.fleet-partial``
# of earlier versions) are Fleet's: they are never copied into a sandbox and are removed when seen.
TEMP_PREFIX = ".fleet-partial-"
_OLD_SUFFIX = ".fleet-partial"
_HEX = frozenset("0123456789abcdef")
MAX_REPORTED = 10  # unsaved files named to the host (the report stays one atomic pipe write)

Failure = collections.namedtuple("Failure", "path errno strerror")
"""A file (or folder) the copy-back could not write to the host: its path, errno and strerror."""


def is_leftover(name: str) -> bool:
    """Whether ``name`` is a temporary file of Fleet's copy, left by a copy that was killed:
    ``.fleet-partial-`` and 16 hex digits, or an earlier version's ``.NAME.fleet-partial``."""
    if (
        name.startswith(TEMP_PREFIX)
        and len(name) == len(TEMP_PREFIX) + 16
        and _HEX.issuperset(name[len(TEMP_PREFIX) :])
    ):
        return True
    return name.startswith(".") and name.endswith(_OLD_SUFFIX) and len(name) > len(_OLD_SUFFIX) + 1


_LIBC = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if _LIBC.unshare(flags) != 0:  # os.unshare is Python 3.12+
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if (
        _LIBC.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _enter_namespace() -> None:
    """A private mount namespace; unprivileged hosts need a user namespace (mapping them to 0) to own it."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        _unshare(CLONE_NEWNS)
    else:
        _unshare(CLONE_NEWUSER | CLONE_NEWNS)
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host


def _copy_file(source: str, target: str, mode: int, owner: int | None) -> None:
    """Copy one regular file without following links at either end (the target is written fresh, under a
    random name, and renamed); a copy that fails (a full disk) leaves nothing behind."""
    partial = os.path.join(os.path.dirname(target), TEMP_PREFIX + os.urandom(8).hex())
    with open(source, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            return
        try:
            with open(partial, "wb", opener=lambda p, f: os.open(p, f | os.O_EXCL | os.O_NOFOLLOW, mode)) as dst:
                _copy_data(src.fileno(), dst.fileno())
                if owner is not None:
                    os.fchown(dst.fileno(), owner, owner)
            os.replace(partial, target)
        except BaseException:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise


def _copy_data(src: int, dst: int) -> None:
    """Copy only the data extents: holes stay holes, so a sparse file costs the host what it cost the tmpfs."""
    size = os.fstat(src).st_size
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole is left
                break
            raise
        end = os.lseek(src, start, os.SEEK_HOLE)
        while start < end:
            chunk = os.pread(src, min(_CHUNK, end - start), start)
            if not chunk:
                break
            os.pwrite(dst, chunk, start)
            start += len(chunk)
        offset = end
    os.ftruncate(dst, size)


def _file_mode(st: os.stat_result) -> int:
    """Owner-only modes: nothing copied either way is group- or world-accessible."""
    return 0o700 if st.st_mode & stat.S_IXUSR else 0o600


def copy_in(host: str, stage: str, owner: int | None) -> Snapshot:
    """The host workspace into the tmpfs (regular files and folders; links are left out); what fits is listed."""
    snapshot: Snapshot = {}
    for dirpath, dirnames, filenames, folder in os.fwalk(host):  # never follows links; files opened at ``folder``
        rel = os.path.relpath(dirpath, host)
        _prune(rel, dirnames)
        for name in sorted(dirnames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                dirnames.remove(name)
                continue
            target = os.path.normpath(os.path.join(stage, rel, name))
            try:
                os.mkdir(target, 0o700)
                if owner is not None:
                    os.chown(target, owner, owner)
            except OSError as exc:
                dirnames.remove(name)
                print(f"fleet: {os.path.join(rel, name)} not copied into the sandbox: {exc.strerror}", file=sys.stderr)
        for name in sorted(filenames):
            relative = os.path.normpath(os.path.join(rel, name))
            target = os.path.join(stage, relative)
            if is_leftover(name):  # a killed copy's temporary: it only holds the host's disk
                _remove(os.path.join(dirpath, name))
                continue
            try:
                copied = _copy_in_file(folder, name, target, owner)
                if copied is not None:
                    snapshot[relative] = (copied.st_ino, copied.st_size, copied.st_mtime_ns)
            except OSError as exc:  # over the quota: the rest stays on the host, untouched
                print(f"fleet: {relative} not copied into the sandbox: {exc.strerror}", file=sys.stderr)
    return snapshot


def _copy_in_file(folder: int, name: str, target: str, owner: int | None) -> os.stat_result | None:
    """The host file ``name`` in ``folder`` into the fresh tmpfs: its stat there, or None for what is not a
    regular file (a link is never followed, a FIFO never blocks the open). Nothing is at ``target`` yet, so no
    temporary name is needed; a copy that fails (the quota) removes what it wrote. A few system calls a file,
    since a workspace may hold up to ``[sandbox] workspace_files`` of them and every turn copies them in."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link: left out, as the walk leaves out linked folders
            return None
        raise
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return None
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _file_mode(st))
        try:
            if st.st_size <= _CHUNK and st.st_blocks * 512 >= st.st_size:  # small and not sparse: one read
                data = memoryview(os.read(src, _CHUNK))
                while data:
                    data = data[os.write(dst, data) :]
            else:
                _copy_data(src, dst)
            if owner is not None:
                os.fchown(dst, owner, owner)
            return os.fstat(dst)
        except BaseException:
            os.unlink(target)
            raise
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _prune(rel: str, dirnames: list[str]) -> None:
    if dirnames and rel.count(os.sep) + 1 >= MAX_DEPTH:
        print(f"fleet: folders under {rel} are nested too deep to copy", file=sys.stderr)
        dirnames.clear()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        print(f"fleet: {path} not removed: {exc.strerror}", file=sys.stderr)


def _clear(path: str) -> None:
    """Remove whatever is at ``path`` on the host (a folder code replaced by a file, or the other way)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            _clear(os.path.join(path, name))
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


def copy_out(stage: str, host: str, snapshot: Snapshot) -> list[Failure]:
    """What the sandbox changed back to the host: new and changed files, and deletions of copied-in ones.

    Files the host added meanwhile (uploads) and files that did not fit at copy-in are left alone.
    ``host`` is the workspace's real path (no link in it): one swapped in since is refused, not followed.
    Returns what could not be saved (a full host disk, a name the host refuses), each also on stderr.
    """
    if os.path.realpath(host) != os.path.normpath(host):
        raise OSError(errno.ELOOP, f"{host} was replaced by a link since the sandbox started; nothing saved")
    seen: set[str] = set()
    failures: list[Failure] = []

    def failed(relative: str, exc: OSError) -> None:
        print(f"fleet: {relative} not saved from the sandbox: {exc.strerror}", file=sys.stderr)
        failures.append(Failure(relative, exc.errno or 0, exc.strerror or str(exc)))

    for dirpath, dirnames, filenames in os.walk(stage):
        rel = os.path.relpath(dirpath, stage)
        _prune(rel, dirnames)
        for name in list(dirnames):
            target = os.path.normpath(os.path.join(host, rel, name))
            try:
                if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
                    _clear(target)
                if not os.path.lexists(target):
                    os.mkdir(target, 0o700)
            except OSError as exc:
                failed(os.path.normpath(os.path.join(rel, name)) + "/", exc)
                dirnames.remove(name)
        for name in filenames:
            relative = os.path.normpath(os.path.join(rel, name))
            source, target = os.path.join(stage, relative), os.path.join(host, relative)
            st = os.lstat(source)
            if not stat.S_ISREG(st.st_mode):
                continue  # fifos, sockets: nothing the host keeps
            seen.add(relative)
            if snapshot.get(relative) == (st.st_ino, st.st_size, st.st_mtime_ns) and os.path.lexists(target):
                continue
            if is_leftover(name):
                failed(relative, OSError(errno.EINVAL, "the name is reserved for Fleet's temporary files"))
                continue
            try:
                if os.path.isdir(target) and not os.path.islink(target):
                    _clear(target)
                _copy_file(source, target, _file_mode(st), None)
            except OSError as exc:
                failed(relative, exc)
    _delete_removed(stage, host, set(snapshot) - seen)
    return failures


def _delete_removed(stage: str, host: str, removed: set[str]) -> None:
    """Delete from the host the copied-in files the sandbox deleted, and the folders it left empty."""
    for relative in sorted(removed, reverse=True):
        target = os.path.join(host, relative)
        if os.path.islink(target) or os.path.isfile(target):
            os.unlink(target)
        parent = os.path.dirname(relative)
        while parent and not os.path.isdir(os.path.join(stage, parent)):
            try:
                os.rmdir(os.path.join(host, parent))
            except OSError:
                break
            parent = os.path.dirname(parent)


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


class Options:
    """The command line ``_argv.sandbox_argv`` writes: ``--name value`` pairs (the plural ones repeat), then
    ``--`` and bubblewrap's argv (``command``)."""

    def __init__(self, argv: list[str]) -> None:
        self.workspace: str | None = None  # the host workspace (or, with adopt_fd, sent when adopted)
        # a socket: start the sandbox now, read the workspace from it (one line), copy it in, answer "ok"
        # (a pre-started sandbox adopted by a session)
        self.adopt_fd: int | None = None
        self.mount = ""  # mount point for the tmpfs (an empty folder)
        self.size = 0  # the tmpfs's bytes
        self.inodes = 0  # its files and folders, the root included
        self.saved_fd: int | None = None  # a pipe: "saved" once the workspace is copied back (never passed on)
        self.expose: list[str] = []  # SOURCE=MOUNTPOINT: bind SOURCE read-only there (for bubblewrap to bind on)
        self.join_fds: list[int] = []  # cgroup.procs to join after the copy-in
        self.keep_fds: list[int] = []  # fds bubblewrap needs
        self.rlimits: list[str] = []  # WHICH:SOFT:HARD, set on this process first (see sandbox_argv)
        self.command: list[str] = []
        words = iter(argv)
        for word in words:
            if word == "--":
                break
            value = next(words, None)
            if value is None:
                raise SystemExit(f"_stage.py: {word} needs a value")
            self._take(word, value)
        self.command = list(words)
        if not (self.mount and self.size and self.inodes and self.command):
            raise SystemExit("_stage.py: --mount, --size, --inodes and, after --, a command are required")
        if (self.workspace is None) == (self.adopt_fd is None):
            raise SystemExit("_stage.py: one of --workspace and --adopt-fd is required")

    def _take(self, word: str, value: str) -> None:
        match word:
            case "--workspace":
                self.workspace = value
            case "--adopt-fd":
                self.adopt_fd = int(value)
            case "--mount":
                self.mount = value
            case "--size":
                self.size = int(value)
            case "--inodes":
                self.inodes = int(value)
            case "--saved-fd":
                self.saved_fd = int(value)
            case "--expose":
                self.expose.append(value)
            case "--join-fd":
                self.join_fds.append(int(value))
            case "--keep-fd":
                self.keep_fds.append(int(value))
            case "--rlimit":
                self.rlimits.append(value)
            case _:
                raise SystemExit(f"_stage.py: unknown option {word}")


class Child:
    """bubblewrap, started by fork and exec with only stdio and ``keep`` open: what ``subprocess.Popen`` did
    here (``pass_fds``, ``close_fds``, ``preexec_fn``), for a process that has no threads to make a fork unsafe."""

    def __init__(self, command: list[str], keep: list[int], before_exec: Callable[[], None] | None) -> None:
        self.code: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            try:
                for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; Popen restored them too
                    signal.signal(signum, signal.SIG_DFL)
                if before_exec is not None:  # before the fds close, as Popen ran preexec_fn: it may write to them
                    before_exec()
                edges = [2, *sorted(keep), os.sysconf("SC_OPEN_MAX")]
                for low, high in itertools.pairwise(edges):
                    os.closerange(low + 1, high)  # all but stdio and ``keep``, which stay inheritable
                for fd in keep:
                    os.set_inheritable(fd, True)
                os.execvp(command[0], command)  # noqa: S606 - the bubblewrap argv the host built
            except BaseException as exc:  # noqa: BLE001 - the child's only way out is _exit
                os.write(2, f"fleet: could not start the sandbox: {exc}\n".encode())
            finally:
                os._exit(127)

    def poll(self) -> int | None:
        """The exit status (a signal as its negative number, as Popen has it), or None while it runs."""
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self) -> int:
        if self.code is None:
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def kill(self) -> None:
        if self.code is None:  # never a pid that was reaped, and may be another process's now
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    opts = Options(argv)
    for spec in opts.rlimits:  # before anything else: what the stage and everything it starts run under
        which, soft, hard = (int(part) for part in spec.split(":"))
        resource.setrlimit(which, (soft, hard))
    child: list[Child] = []
    stopping: list[bool] = []

    def stop(_signum: int, _frame: object) -> None:
        stopping.append(True)
        for process in child:
            process.kill()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    sandbox_uid = UID_BASE + os.getpid() if os.getuid() == 0 else None
    _enter_namespace()
    _mount(
        "fleet-workspace",
        opts.mount,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={opts.size},nr_inodes={opts.inodes},mode=0700"
        + (f",uid={sandbox_uid},gid={sandbox_uid}" if sandbox_uid is not None else ""),
    )
    for spec in opts.expose:
        source, _, target = spec.partition("=")
        _mount(source, target, None, MS_BIND | MS_REC)
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if opts.workspace is None:
        return _adopted(opts, sandbox_uid, child, stopping)
    snapshot = copy_in(opts.workspace, opts.mount, sandbox_uid)
    for fd in opts.join_fds:  # after the copy, so the cgroup's memory limit counts only what the code writes
        os.write(fd, b"0")
        os.close(fd)
    code = 128 + signal.SIGTERM
    if not stopping:
        process = Child(opts.command, opts.keep_fds, None if sandbox_uid is None else lambda: _drop_to(sandbox_uid))
        child.append(process)
        if stopping:
            process.kill()
        code = process.wait()
    return _save(opts.mount, opts.workspace, snapshot, code, opts.saved_fd)


def _let_go_of_the_channel() -> None:
    """Drop this process's copies of the protocol pipes (stdin, stdout): only the sandbox holds them then, so
    the host sees their end (EOF) the moment the sandboxed runtime dies, and never hands out a dead one."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _read_line(fd: int) -> str | None:
    """One line from the adopt socket; None when the host closed it first (the pooled sandbox is discarded)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    return data.decode().rstrip("\n")


def _adopted(
    opts: Options,
    sandbox_uid: int | None,
    child: list[Child],
    stopping: list[bool],
) -> int:
    """Start bubblewrap on the empty tmpfs, then copy in the workspace the host names when it adopts us.

    The sandboxed process joins the cgroup itself (before dropping to its uid), so this process stays out
    and, as without adoption, what is copied in does not count against the sandbox's memory limit.
    """

    def enter() -> None:
        for fd in opts.join_fds:
            os.write(fd, b"0")
        if sandbox_uid is not None:
            _drop_to(sandbox_uid)

    assert opts.adopt_fd is not None  # noqa: S101 - Options requires it without --workspace
    process = Child(opts.command, opts.keep_fds, enter)
    child.append(process)
    for fd in opts.join_fds:
        os.close(fd)
    _let_go_of_the_channel()
    workspace = None if stopping else _read_line(opts.adopt_fd)
    if workspace is None or stopping:  # never adopted: nothing to save
        process.kill()
        code = process.wait()
        return code if code >= 0 else 128 - code
    try:
        snapshot = copy_in(workspace, opts.mount, sandbox_uid)
    except OSError as exc:
        os.write(opts.adopt_fd, f"error {exc}\n".encode())
        process.kill()
        process.wait()
        return 1
    if process.poll() is not None:  # died while it waited (killed, out of memory): the host starts another
        os.write(opts.adopt_fd, b"error the sandbox exited while it waited\n")
        return 1
    os.write(opts.adopt_fd, b"ok\n")
    os.close(opts.adopt_fd)
    return _save(opts.mount, workspace, snapshot, process.wait(), opts.saved_fd)


def _save(mount: str, workspace: str, snapshot: Snapshot, code: int, saved_fd: int | None) -> int:
    """Copy the sandbox's changes back to the host workspace, and say so on ``saved_fd``: the host stops
    waiting there, while this process's exit tears its mount namespace down. The exit status to pass on."""
    failures: list[Failure] = []
    try:
        failures = copy_out(mount, workspace, snapshot)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # ENOENT: the session was deleted meanwhile; never recreate it
            print(f"fleet: the workspace was not fully saved: {exc}", file=sys.stderr)
            failures = [Failure(".", exc.errno or 0, exc.strerror or str(exc))]
    except Exception as exc:  # noqa: BLE001 - whatever code left behind, report and pass on the exit status
        print(f"fleet: the workspace was not fully saved: {exc!r}", file=sys.stderr)
        failures = [Failure(".", 0, repr(exc)[:200])]
    if saved_fd is not None:
        sys.stderr.flush()  # what went wrong is in the host's hands before it stops listening
        try:
            os.write(saved_fd, saved_line(failures))
        except OSError:
            pass  # the host is gone or waits for the exit instead
    return code if code >= 0 else 128 - code


def saved_line(failures: list[Failure]) -> bytes:
    """What the host reads on ``--saved-fd``: ``saved``, or ``unsaved`` and a JSON report of what was lost
    (the count and the first few paths, shortened, so it stays one atomic pipe write)."""
    if not failures:
        return b"saved\n"
    import json  # noqa: PLC0415 - only when something was lost: a sandbox start does not pay its import

    files = [[f.path[:200], f.errno, f.strerror[:100]] for f in failures[:MAX_REPORTED]]
    return b"unsaved " + json.dumps({"count": len(failures), "files": files}).encode() + b"\n"


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(status)  # the workspace is saved: the host waits for this exit, so skip the interpreter's teardown
