"""Machine-wide slots for ``local`` sandboxes: at most ``[sandbox] max_sandboxes`` run at once for this user.

A slot is an exclusive ``flock`` on one of the files ``0`` .. ``cap - 1`` in ``fleet-sandboxes-<uid>`` in the
temp dir, held by whatever runs a sandbox (a ready one in a pool too), so every Fleet process of this user on
the machine (a server, kernels) counts against one cap, and a slot frees itself when its holder dies: the OS
drops the lock with the last descriptor. A process waiting for a slot holds a lock on a file under
``waiting/``; pools (in any process) then give up a ready sandbox for it (``someone_waits``).

A turn reserves a slot when it starts (``reserve``, keyed by its workspace), so a burst of turns is refused
at once (503) instead of each failing later; the turn's first sandbox runs on that slot (``claim``), and a
sandbox of the turn that stops hands it back to the reservation until the turn ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from fleet_kernel.errors import SandboxUnavailableError

WAIT_SLICE_S = 0.05
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


def folder() -> Path:
    """This user's slot folder (owner-only), made on first use and again if a tmp cleaner removed it.

    Raises:
        SandboxUnavailableError: the name is taken by something that is not this user's folder (another
            user could hold every slot there).
    """
    path = Path(tempfile.gettempdir()) / f"fleet-sandboxes-{os.getuid()}"
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(path) if os.path.lexists(path) else None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but loosened: tightened, as safe_files.private_child does
    elif st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SandboxUnavailableError(
            f"{path} is not a folder only this user can use, so sandboxes cannot be counted there: "
            "remove it, or point TMPDIR at a private folder"
        )
    (path / "waiting").mkdir(mode=0o700, exist_ok=True)
    return path


def _lock(path: Path) -> int | None:
    """A descriptor holding ``path``'s exclusive lock, or None when someone else holds it."""
    fd = os.open(path, _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_fresh(path: Path) -> int:
    """A descriptor holding ``path``'s exclusive lock, for a new name nobody else knows (so it never waits)."""
    fd = os.open(path, _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


class Slot:
    """One held slot; ``release`` frees it (or hands it back to its turn's reservation). Idempotent."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self.home: Reservation | None = None

    def release(self) -> None:
        if self._fd is None or (self.home is not None and self.home.put_back(self)):
            return
        fd, self._fd = self._fd, None
        os.close(fd)


def _try(cap: int) -> Slot | None:
    base = folder()
    for number in range(cap):
        fd = _lock(base / str(number))
        if fd is not None:
            return Slot(fd)
    return None


def held(cap: int) -> int:
    """How many of the ``cap`` slots are held right now (by any process)."""
    base, count = folder(), 0
    for number in range(cap):
        fd = _lock(base / str(number))
        if fd is None:
            count += 1
        else:
            os.close(fd)
    return count


@contextlib.contextmanager
def _waiting() -> Iterator[None]:
    """Be seen waiting (``someone_waits``) while the block runs: locked first, then given its visible name."""
    base = folder() / "waiting"
    name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    fd = _lock_fresh(base / f".{name}")
    os.rename(base / f".{name}", base / name)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(base / name)
        os.close(fd)


def someone_waits() -> bool:
    """Whether a sandbox (anywhere on the machine, for this user) waits for a slot; clears leftovers of dead waiters."""
    for path in (folder() / "waiting").iterdir():
        if path.name.startswith("."):
            continue
        try:
            fd = _lock(path)
        except OSError:
            continue  # gone meanwhile
        if fd is None:
            return True
        with contextlib.suppress(OSError):
            path.unlink()  # its waiter died without cleaning up
        os.close(fd)
    return False


def acquire(cap: int, *, wait_s: float = 0.0, stop: Callable[[], bool] = lambda: False) -> Slot | None:
    """A free slot, waiting up to ``wait_s`` (seen waiting meanwhile) unless ``stop`` says to give up."""
    slot = _try(cap)
    if slot is not None or wait_s <= 0:
        return slot
    deadline = time.monotonic() + wait_s
    with _waiting():
        while slot is None and time.monotonic() < deadline and not stop():
            time.sleep(WAIT_SLICE_S)
            slot = _try(cap)
    return slot


class Reservation:
    """A turn's slot from its start to its end; the turn's sandboxes run on it one at a time."""

    def __init__(self, key: str, slot: Slot) -> None:
        self._key = key
        self._slot: Slot | None = slot
        self._open = True
        self._lock = threading.Lock()
        slot.home = self

    def take(self) -> Slot | None:
        with self._lock:
            slot, self._slot = self._slot, None
        return slot

    def put_back(self, slot: Slot) -> bool:
        """Keep ``slot`` for the turn's next sandbox; false once the turn ended (the slot is then freed)."""
        with self._lock:
            if self._open and self._slot is None:
                self._slot = slot
                return True
            slot.home = None
            return False

    def release(self) -> None:
        """The turn ended: free the slot if no sandbox holds it (one that does frees it when it stops)."""
        with _registry_lock:
            if _reserved.get(self._key) is self:
                del _reserved[self._key]
        with self._lock:
            self._open = False
            slot, self._slot = self._slot, None
        if slot is not None:
            slot.home = None
            slot.release()


_reserved: dict[str, Reservation] = {}
_registry_lock = threading.Lock()


def reserved(key: str) -> bool:
    with _registry_lock:
        return key in _reserved


def reserve(key: str, cap: int, *, wait_s: float) -> Reservation | None:
    """A reservation for the turn working in ``key`` (its workspace), or None when no slot freed in ``wait_s``."""
    slot = acquire(cap, wait_s=wait_s)
    if slot is None:
        return None
    reservation = Reservation(key, slot)
    with _registry_lock:
        _reserved[key] = reservation
    return reservation


def claim(key: str) -> Slot | None:
    """The reserved slot of the turn working in ``key``, if it is free (its first sandbox, or a restart)."""
    with _registry_lock:
        reservation = _reserved.get(key)
    return reservation.take() if reservation is not None else None
