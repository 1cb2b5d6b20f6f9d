"""Alembic, driven from code: ``fleet db upgrade`` and the SQLite first-use upgrade."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from fleet_kernel.errors import StoreUnavailableError

UPGRADE_LOCK_TIMEOUT_S = 30.0  # longest a start waits for another process's upgrade of a SQLite store
LOCK_POLL_S = 0.1


def migrations_dir() -> Path:
    """The Alembic environment: ``fleet_kernel/migrations`` in a wheel, ``migrations/`` in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("Fleet's Alembic migrations are missing from this installation; reinstall fleet-kernel")


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def upgrade(database_url: str) -> None:
    """Apply every migration up to head. Blocking: call it from a thread when a loop runs.

    On a SQLite file, one process at a time: a kernel and its sidecar open a new store together, and two
    upgrades at once collide (``table _alembic_tmp_sessions already exists``). Under the lock Alembic
    reads the revision again, so the second finds the store at head and does nothing.
    """
    require_driver(database_url)
    with _sqlite_upgrade_lock(database_url):
        command.upgrade(alembic_config(database_url), "head")


def require_driver(database_url: str) -> None:
    """Check that the database driver the URL names is installed (asyncpg is an extra, not a dependency).

    Raises:
        StoreUnavailableError: the driver cannot be imported; the message says what to install.
    """
    url = make_url(database_url)
    try:
        url.get_dialect().import_dbapi()
    except ImportError as exc:
        where = url.render_as_string(hide_password=True)
        if url.get_backend_name() == "postgresql":
            fix = "pip install 'fleet-kernel[postgres]'"
        else:
            fix = f"pip install {exc.name or url.get_driver_name()}"
        raise StoreUnavailableError(
            f"the store at {where} needs the database driver {exc.name or url.get_driver_name()}, "
            f"which is not installed: {fix}"
        ) from exc


def sqlite_file(database_url: str) -> str | None:
    """The file of a SQLite store; None for an in-memory one or another database."""
    url = make_url(database_url)
    path = url.database if url.get_backend_name() == "sqlite" else None
    return path if path and path != ":memory:" else None


@contextlib.contextmanager
def _sqlite_upgrade_lock(database_url: str) -> Iterator[None]:
    """The SQLite file's ``.upgrade-lock``, waited for at most ``UPGRADE_LOCK_TIMEOUT_S``.

    A lock that another process holds that long (a hung upgrade, or another user holding a lock file it
    planted) would otherwise stop every start for ever; a lock file that is not this user's is refused at once.

    Raises:
        StoreUnavailableError: the lock is another user's, or was not free in time; the message names the file.
    """
    path = sqlite_file(database_url)
    if path is None:
        yield
        return
    lock = f"{os.path.abspath(path)}.upgrade-lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreUnavailableError(f"cannot open the store's upgrade lock {lock}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            raise StoreUnavailableError(
                f"the store's upgrade lock {lock} is not a file of this user (owner uid {st.st_uid}): "
                "remove it, and make sure no other user can write the store's folder"
            )
        deadline = time.monotonic() + UPGRADE_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreUnavailableError(
                        f"the store's upgrade lock {lock} has been held by another process for "
                        f"{UPGRADE_LOCK_TIMEOUT_S:g} s: stop the Fleet process upgrading the store (`fuser {lock}` "
                        "names it), or remove the file if none runs, then start again"
                    ) from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock
