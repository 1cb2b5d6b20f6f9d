"""Alembic, driven from code: ``fleet db upgrade`` and the SQLite first-use upgrade."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url


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
    with _sqlite_upgrade_lock(database_url):
        command.upgrade(alembic_config(database_url), "head")


def sqlite_file(database_url: str) -> str | None:
    """The file of a SQLite store; None for an in-memory one or another database."""
    url = make_url(database_url)
    path = url.database if url.get_backend_name() == "sqlite" else None
    return path if path and path != ":memory:" else None


@contextlib.contextmanager
def _sqlite_upgrade_lock(database_url: str) -> Iterator[None]:
    path = sqlite_file(database_url)
    if path is None:
        yield
        return
    fd = os.open(f"{path}.upgrade-lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
