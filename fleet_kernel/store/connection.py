"""The connection to the database: engines, SQLite tuning, schema checks, health, transactions, and the
rule that a store call, once started, runs to completion.

SQLite (WAL, busy timeout, writes in ``BEGIN IMMEDIATE``) by default, PostgreSQL (asyncpg) for teams.
Each concern module (sessions, turns, leases, the event log, files, ...) is a ``Repository`` over the
one ``Database`` that ``Store`` composes them on: each store call is one plain function of a SQLAlchemy
``Session``, run in one transaction by ``_read`` or ``_write``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import shutil
import sqlite3
import stat
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from fleet_kernel import ownership, safe_files
from fleet_kernel.errors import NotFoundError, StoreUnavailableError
from fleet_kernel.store import migrate

# Free space below this on the disk of a SQLite store makes it unwritable for health checks.
MIN_FREE_BYTES = 1024 * 1024

P = ParamSpec("P")
R = TypeVar("R")


def uninterrupted(method: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Let a store call that has started finish before a cancellation reaches its caller.

    Cancelling a task in the middle of a database call makes SQLAlchemy terminate the connection, and
    with aiosqlite 0.22 that close can wait for ever, so the event loop never shuts down (an SSE client
    that disconnects, a kernel interrupted mid-read). Store calls take milliseconds: the caller waits
    for the call to end, then sees its ``CancelledError``.
    """

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        task = asyncio.ensure_future(method(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # consumed: the cancelled caller hears only of its cancellation
            raise

    return call


def is_disk_full(exc: BaseException) -> bool:
    """Whether a store error (or one it wraps) says the disk holding the database is full."""
    for cause in _causes(exc):
        message = str(cause).lower()
        number = getattr(cause, "errno", None)
        full = getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or number == errno.ENOSPC
        if full or "disk is full" in message or "no space left" in message:
            return True
    return False


def describe_write_error(exc: BaseException, location: str) -> str:
    """Say why the store cannot be written, naming a full disk, in words a user can act on."""
    if is_disk_full(exc):
        return f"the disk holding the store ({location}) is full: free space there, then run the turn again"
    for cause in _causes(exc):
        message = str(cause).lower()
        number = getattr(cause, "errno", None)
        if "readonly" in message or "read-only" in message or number == errno.EROFS:
            return f"the store ({location}) is read-only: make it writable, then run the turn again"
    return f"the store ({location}) cannot be written: {str(getattr(exc, 'orig', None) or exc)[:300]}"


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """The exception, the driver error SQLAlchemy wraps, and their causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


FileId = tuple[str, int, int]  # a SQLite file as opened: its absolute path, st_dev and st_ino


def _private_sqlite_file(path: str) -> FileId:
    """Create the database file (and its folder) for the owner only; SQLite gives -wal and -shm its mode.

    The folder must be safely this user's (``ownership``), and nothing in it is taken through a link.
    Returns the file's identity, to notice later that it was deleted or replaced.
    """
    folder, name = os.path.split(os.path.abspath(path))
    ownership.check_home(Path(folder), "the store's folder")
    with safe_files.private_dirs(Path(folder)) as fd:
        st = _own_file(fd, name, f"{folder}/{name}", create=True)
        for extra in (f"{name}-wal", f"{name}-shm"):
            with contextlib.suppress(FileNotFoundError):
                _own_file(fd, extra, f"{folder}/{extra}")
    return f"{folder}/{name}", st.st_dev, st.st_ino


def _own_file(dir_fd: int, name: str, where: str, *, create: bool = False) -> os.stat_result:
    """Check ``name`` is this user's regular file (not a link) and make it 0600; with ``create``, make it if missing.

    An existing file is never opened: closing any descriptor of a file drops every POSIX lock this process holds
    on it, and SQLite's connections in this process hold theirs on the database and its -shm file.
    """
    if create:
        with contextlib.suppress(FileExistsError):  # a new file: nobody holds a lock on it yet
            os.close(
                os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            )
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
        raise StoreUnavailableError(f"the store file {where} is not a file of this user: move it away")
    if stat.S_IMODE(st.st_mode) != 0o600:
        os.chmod(name, 0o600, dir_fd=dir_fd)  # a regular file of this user's, in a folder only this user can change
    return st


def _same_file(file_id: FileId) -> bool:
    try:
        st = os.stat(file_id[0])
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == file_id[1:]


def _configure_sqlite(engine: Engine) -> None:
    """WAL + busy timeout, and explicit transactions so writers queue instead of failing as locked."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("fleet_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def through(
    part: str, method: Callable[Concatenate[Any, P], Awaitable[R]]
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """A ``Store`` method that is ``method`` of the store's repository ``part``, run ``uninterrupted``."""
    name = method.__name__

    async def call(store: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = await getattr(getattr(store, part), name)(*args, **kwargs)
        return result

    call.__name__, call.__qualname__, call.__doc__ = name, f"Store.{name}", method.__doc__
    return uninterrupted(call)


class Database:
    """One async engine (asyncpg, or aiosqlite for schema checks and health) and, for a SQLite file, a
    plain engine whose transactions run on a worker thread; the base of every part of the store."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        migrate.require_driver(database_url)
        self.sqlite = is_sqlite(database_url)
        kwargs: dict[str, Any] = {}
        if self.sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: AsyncEngine = create_async_engine(database_url, **kwargs)
        if self.sqlite:
            _configure_sqlite(self.engine.sync_engine)
        self.sqlite_file = migrate.sqlite_file(database_url)  # the SQLite file, if the store is one
        if self.sqlite_file is not None:
            # A SQLite file is used through the plain driver on a worker thread: one thread hop per store
            # call instead of one per driver call (aiosqlite), which was most of the cost of a small one
            # (a session read by its key: 0.6 ms against 1.7 ms, measured).
            self._file_engine: Engine | None = create_engine(
                self.engine.url.set(drivername="sqlite"), connect_args={"timeout": 30, "check_same_thread": False}
            )
            _configure_sqlite(self._file_engine)
            self._file_readers = sessionmaker(self._file_engine, expire_on_commit=False)
            self._file_writers = sessionmaker(
                self._file_engine.execution_options(fleet_write=True), expire_on_commit=False
            )
        else:
            self._file_engine = None
        self._file_id: FileId | None = None  # the SQLite file as ``open`` found it
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._write_engine = self.engine.execution_options(fleet_write=True) if self.sqlite else self.engine
        self._writers = async_sessionmaker(self._write_engine, expire_on_commit=False)

    @classmethod
    async def open(cls, database_url: str) -> Self:
        """Open and check the store; a SQLite file is created and upgraded on first use.

        Raises:
            StoreUnavailableError: the database cannot be reached, or (non-SQLite) is not migrated.
        """
        path = migrate.sqlite_file(database_url)
        identity = _private_sqlite_file(path) if path is not None else None
        store = cls(database_url)
        store._file_id = identity
        try:
            current = await store.schema_revision()
            head = await asyncio.to_thread(migrate.head_revision)  # reads the migration scripts: off the loop
            if current != head:
                if not store.sqlite:
                    raise StoreUnavailableError(
                        f"the database at {store.safe_url} is at schema {current or 'none'}, not {head}: "
                        "run `fleet db upgrade` first"
                    )
                await asyncio.to_thread(migrate.upgrade, database_url)
        except OSError as exc:
            await store.close()
            raise StoreUnavailableError(f"cannot reach the database at {store.safe_url}: {exc}") from exc
        except OperationalError as exc:
            await store.close()
            raise StoreUnavailableError(f"cannot use the database at {store.safe_url}: {exc.orig}") from exc
        except BaseException:
            await store.close()
            raise
        return store

    @property
    def safe_url(self) -> str:
        """The URL with any password hidden, fit for messages."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def location(self) -> str:
        """Where the store lives, for messages: the SQLite file, else the URL without its password."""
        return os.path.abspath(self.sqlite_file) if self.sqlite_file is not None else self.safe_url

    @uninterrupted
    async def schema_revision(self) -> str | None:
        async with self.engine.connect() as conn:
            exists = await conn.run_sync(lambda c: c.dialect.has_table(c, "alembic_version"))
            if not exists:
                return None
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
            return str(row[0]) if row else None

    @uninterrupted
    async def close(self) -> None:
        await self.engine.dispose()
        if self._file_engine is not None:
            self._file_engine.dispose()

    @uninterrupted
    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - health checks report, never raise
            return False

    @uninterrupted
    async def check_writable(self, *, write: bool = True) -> str | None:
        """``None`` if a write can be committed now, else what stops it (a full disk, a read-only or deleted file).

        ``write=False`` checks only the SQLite file and its disk, without the probe's write transaction.
        """
        if self.sqlite_file is not None:
            problem = await asyncio.to_thread(self._file_problem, self.sqlite_file)  # stat calls: off the loop
            if problem is not None:
                return problem
        if not write:
            return None
        try:  # a real write that changes nothing
            await self._write(lambda s: s.execute(text("UPDATE alembic_version SET version_num = version_num")))
        except Exception as exc:  # noqa: BLE001 - health checks report, never raise
            return describe_write_error(exc, self.location)
        return None

    def _file_problem(self, path: str) -> str | None:
        """What stops writes to the SQLite file itself (deleted, moved, a full disk), if anything."""
        if not os.path.exists(path) or (self._file_id is not None and not _same_file(self._file_id)):
            return f"the database file {path} was deleted or moved: restore it or restart Fleet"
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        if free < MIN_FREE_BYTES:
            return f"the disk holding the store ({path}) is full ({free} bytes free): free space there"
        return None

    async def _read(self, work: Callable[[Session], R]) -> R:
        """``work(session)`` in a read transaction; returns what it returns."""
        if self._file_engine is not None:
            return await asyncio.to_thread(_run, self._file_readers, work)
        async with self._sessions() as session:
            return await session.run_sync(work)

    async def _write(self, work: Callable[[Session], R]) -> R:
        """``work(session)`` in a write transaction (``BEGIN IMMEDIATE`` on SQLite), committed when it
        returns and rolled back when it raises."""
        if self._file_engine is not None:
            self._check_file()
            return await asyncio.to_thread(_run, self._file_writers, work, commit=True)
        async with self._writers.begin() as session:
            return await session.run_sync(work)

    def _check_file(self) -> None:
        """Refuse a write once the SQLite file is gone: SQLite would keep writing to the deleted inode, every
        write "succeeding" and lost at the next start.

        Raises:
            StoreUnavailableError: the file was deleted, moved or replaced since the store opened it.
        """
        if self._file_id is not None and not _same_file(self._file_id):
            raise StoreUnavailableError(
                f"the store file {self._file_id[0]} was deleted or replaced while Fleet was running, so nothing "
                "more can be saved: restore it, or restart Fleet to start a new store"
            )

    async def _get(self, model: type[R], key: str, missing: str) -> R:
        """One row by primary key, or ``NotFoundError(missing)``."""
        row = await self._read(lambda s: s.get(model, key))
        if row is None:
            raise NotFoundError(missing)
        return row


class Repository:
    """One concern of the store (its sessions, turns, event log, ...): its queries, each run in one
    transaction of the shared ``Database``. ``Store`` composes them and serves their public methods."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def sqlite(self) -> bool:
        return self.db.sqlite

    @property
    def engine(self) -> AsyncEngine:
        return self.db.engine

    async def _read(self, work: Callable[[Session], R]) -> R:
        return await self.db._read(work)

    async def _write(self, work: Callable[[Session], R]) -> R:
        return await self.db._write(work)

    async def _get(self, model: type[R], key: str, missing: str) -> R:
        return await self.db._get(model, key, missing)


def _run(sessions: sessionmaker[Session], work: Callable[[Session], R], *, commit: bool = False) -> R:
    """One transaction of a SQLite file's store call, on a worker thread."""
    with sessions() as session:
        if not commit:
            return work(session)
        with session.begin():
            return work(session)
