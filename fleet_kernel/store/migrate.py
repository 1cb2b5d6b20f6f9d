"""Alembic, driven from code: ``fleet db upgrade`` and the SQLite first-use upgrade.

Alembic itself (with Mako and its dialect modules, ~0.15 s of CPU) is imported only to upgrade: every
store's open compares the database's revision with ``head_revision``, which reads the revision lines
of the migration scripts without it. A kernel opens its store while its first cell waits.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from fleet_kernel.errors import StoreUnavailableError

if TYPE_CHECKING:
    from alembic.config import Config

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
    from alembic.config import Config  # noqa: PLC0415 - Alembic loads only to upgrade (see the module's doc)

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    """The revision the migrations end at, read from the scripts' ``revision`` and ``down_revision`` lines.

    Anything the plain reading cannot settle (a script that computes its revision, a merge that leaves two
    heads) is left to Alembic, which answers the same or raises as it always did.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in sorted((migrations_dir() / "versions").glob("*.py")):
        found = _revision_lines(script)
        if found is None:
            return _alembic_head()
        revision, down = found
        revisions.add(revision)
        parents.update(down)
    heads = revisions - parents
    if len(heads) != 1:
        return _alembic_head()
    return heads.pop()


def _revision_lines(script: Path) -> tuple[str, tuple[str, ...]] | None:
    """``(revision, down revisions)`` of one migration script as literals, or None if they are not literals."""
    values: dict[str, object] = {}
    try:
        body = ast.parse(script.read_text(encoding="utf-8"), str(script)).body
    except (OSError, SyntaxError, ValueError):
        return None
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
            try:
                values[target.id] = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError):
                return None
    revision, down = values.get("revision"), values.get("down_revision")
    if not isinstance(revision, str):
        return None
    if down is None:
        return revision, ()
    if isinstance(down, str):
        return revision, (down,)
    if isinstance(down, tuple | list) and all(isinstance(d, str) for d in down):
        return revision, tuple(down)
    return None


def _alembic_head() -> str | None:
    from alembic.script import ScriptDirectory  # noqa: PLC0415 - Alembic loads only when it must

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def upgrade(database_url: str) -> None:
    """Apply every migration up to head. Blocking: call it from a thread when a loop runs.

    On a SQLite file, one process at a time: a kernel and its sidecar open a new store together, and two
    upgrades at once collide (``table _alembic_tmp_sessions already exists``). Under the lock Alembic
    reads the revision again, so the second finds the store at head and does nothing.
    """
    require_driver(database_url)
    from alembic import command  # noqa: PLC0415 - Alembic loads only to upgrade

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
