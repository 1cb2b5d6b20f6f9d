"""The durable store: one class owning the engine, methods named for what they do.

SQLite (aiosqlite, WAL, busy timeout, writes in ``BEGIN IMMEDIATE``) by default, PostgreSQL (asyncpg)
for teams. Every process that runs or watches turns opens its own ``Store`` on the same URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import json
import errno
import os
import shutil
import socket
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import psutil
from sqlalchemy import and_, create_engine, delete, event, func, insert, or_, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from fleet_kernel.errors import ConflictError, NotFoundError, StoreUnavailableError, ValidationError
from fleet_kernel.events import ROOT_AGENT, TERMINAL_TYPES, Event, TurnFailed, utc_timestamp
from fleet_kernel.store import migrate
from fleet_kernel.store.models import (
    ArtifactRow,
    AttachmentRow,
    BlobRow,
    EventRow,
    SessionRow,
    TurnRow,
)

__all__ = ["Store", "SessionRow", "TurnRow", "AttachmentRow", "ArtifactRow", "new_id", "utcnow", "PROCESS_OWNER"]

# The lease of a running turn: its owner beats every 0.5 s, and a turn whose owner has not beaten for
# this long is taken for dead (a process on another machine, or one whose liveness cannot be checked).
LEASE = timedelta(seconds=5)
# An owner on this machine is checked directly (pid and start time): a dead one loses its turns at once,
# a live one only after this long without a beat (a hung process), so a busy machine never loses a turn.
HUNG_AFTER = timedelta(seconds=30)
# Free space below this on the disk of a SQLite store makes it unwritable for health checks.
MIN_FREE_BYTES = 1024 * 1024


def _machine() -> str:
    """This boot of this machine, and this pid namespace: where a recorded pid means the same process."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{int(psutil.boot_time())}.{namespace}"


def _owner_identity() -> str:
    """``host:pid:start_ms:machine:nonce``: enough for another process on this machine to tell whether the
    owner still lives (a reused pid has another start time; another machine or container with the same
    host name has another boot time or pid namespace)."""
    started = int(psutil.Process().create_time() * 1000)
    return f"{socket.gethostname()}:{os.getpid()}:{started}:{_machine()}:{uuid.uuid4().hex[:8]}"


PROCESS_OWNER = _owner_identity()
# PostgreSQL channel notified by every commit of events, so readers in other processes need not poll.
EVENTS_CHANNEL = "fleet_events"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def owner_state(owner: str) -> str:
    """``dead``, ``alive`` or ``unknown`` (another machine, or an owner recorded without pid and start time)."""
    parts = owner.rsplit(":", 4)
    if len(parts) != 5 or parts[0] != socket.gethostname():
        return "unknown"
    _host, pid, started, machine, _nonce = parts
    if machine != _machine():
        return "unknown"
    try:
        process = psutil.Process(int(pid))
        same = abs(int(process.create_time() * 1000) - int(started)) <= 10
        return "alive" if same and process.status() != psutil.STATUS_ZOMBIE else "dead"
    except ValueError:
        return "unknown"
    except psutil.NoSuchProcess:
        return "dead"
    except psutil.Error:  # e.g. access denied: it exists
        return "alive"


def abandoned(row: TurnRow, now: datetime) -> bool:
    """Whether a running turn's owner is gone: dead on this machine, or silent past its lease."""
    silent = now - row.heartbeat_at
    state = owner_state(row.owner)
    if state == "dead":
        return True
    return silent > (HUNG_AFTER if state == "alive" else LEASE)


def describe_write_error(exc: BaseException, location: str) -> str:
    """Say why the store cannot be written, naming a full disk, in words a user can act on."""
    for cause in _causes(exc):
        message = str(cause).lower()
        number = getattr(cause, "errno", None)
        full = getattr(cause, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or number == errno.ENOSPC
        if full or "disk is full" in message or "no space left" in message:
            return f"the disk holding the store ({location}) is full: free space there, then run the turn again"
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


P = ParamSpec("P")
R = TypeVar("R")


def _uninterrupted(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
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


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _private_sqlite_file(path: str) -> None:
    """Create the database file (and its folder) for the owner only; SQLite gives -wal and -shm its mode."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for name in (path, f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, 0o600)


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


class Store:
    """Sessions, turns, events, attachments, artifacts and blobs over one async engine."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.sqlite = _is_sqlite(database_url)
        kwargs: dict[str, Any] = {}
        if self.sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine = create_async_engine(database_url, **kwargs)
        if self.sqlite:
            _configure_sqlite(self.engine.sync_engine)
        if self.sqlite and self.engine.url.database not in (None, "", ":memory:"):
            # Events are appended from a worker thread through a plain (sync) engine: one thread hop per
            # batch instead of one per driver call, which is most of the cost of a small commit.
            self._event_engine: Engine | None = create_engine(
                self.engine.url.set(drivername="sqlite"), connect_args={"timeout": 30, "check_same_thread": False}
            ).execution_options(fleet_write=True)
            _configure_sqlite(self._event_engine.engine)
        else:
            self._event_engine = None
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._write_engine = self.engine.execution_options(fleet_write=True) if self.sqlite else self.engine
        self._writers = async_sessionmaker(self._write_engine, expire_on_commit=False)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(cls, database_url: str) -> Store:
        """Open and check the store; a SQLite file is created and upgraded on first use.

        Raises:
            StoreUnavailableError: the database cannot be reached, or (non-SQLite) is not migrated.
        """
        if _is_sqlite(database_url):
            path = database_url.split(":///", 1)[-1]
            if path and path != ":memory:":
                _private_sqlite_file(path)
        store = cls(database_url)
        try:
            current = await store.schema_revision()
            head = migrate.head_revision()
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

    async def schema_revision(self) -> str | None:
        async with self.engine.connect() as conn:
            exists = await conn.run_sync(lambda c: c.dialect.has_table(c, "alembic_version"))
            if not exists:
                return None
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
            return row[0] if row else None

    async def close(self) -> None:
        await self.engine.dispose()
        if self._event_engine is not None:
            self._event_engine.engine.dispose()

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - health checks report, never raise
            return False

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncSession]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit."""
        async with self._writers.begin() as session:
            yield session

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session:
            yield session

    # ------------------------------------------------------------------ sessions

    async def create_session(self, title: str = "") -> SessionRow:
        now = utcnow()
        row = SessionRow(session_id=new_id("ses"), title=title[:200], created_at=now, updated_at=now, turn_count=0)
        async with self._write() as s:
            s.add(row)
        return row

    async def get_session(self, session_id: str) -> SessionRow:
        async with self._read() as s:
            row = await s.get(SessionRow, session_id)
        if row is None:
            raise NotFoundError(f"no session {session_id!r}; list sessions with GET /api/sessions")
        return row

    async def list_sessions(self, limit: int = 200) -> list[SessionRow]:
        async with self._read() as s:
            rows = await s.scalars(select(SessionRow).order_by(SessionRow.updated_at.desc()).limit(limit))
            return list(rows)

    async def rename_session(self, session_id: str, title: str) -> SessionRow:
        async with self._write() as s:
            row = await s.get(SessionRow, session_id)
            if row is None:
                raise NotFoundError(f"no session {session_id!r}")
            row.title = title[:200]
            row.updated_at = utcnow()
        return row

    async def delete_session(self, session_id: str) -> None:
        """Delete a session with its turns, events, attachments and artifacts.

        Raises:
            ConflictError: a turn is running in it.
        """
        async with self._write() as s:
            row = await s.get(SessionRow, session_id)
            if row is None:
                raise NotFoundError(f"no session {session_id!r}")
            running = await s.scalar(
                select(TurnRow.turn_id).where(TurnRow.session_id == session_id, TurnRow.status == "running")
            )
            if running:
                raise ConflictError(
                    f"turn {running} is running in this session; cancel it or wait for it to finish",
                    turn_id=running,
                    code="session_busy",
                )
            turn_ids = select(TurnRow.turn_id).where(TurnRow.session_id == session_id)
            digests = set(await s.scalars(select(ArtifactRow.sha256).where(ArtifactRow.session_id == session_id)))
            digests |= set(await s.scalars(select(AttachmentRow.sha256).where(AttachmentRow.session_id == session_id)))
            await s.execute(delete(EventRow).where(EventRow.turn_id.in_(turn_ids)))
            await s.execute(delete(ArtifactRow).where(ArtifactRow.session_id == session_id))
            await s.execute(delete(AttachmentRow).where(AttachmentRow.session_id == session_id))
            await s.execute(delete(TurnRow).where(TurnRow.session_id == session_id))
            await s.delete(row)
            # Their bytes go too, unless another session's attachment or artifact has the same content.
            if digests:
                await s.execute(
                    delete(BlobRow).where(
                        BlobRow.sha256.in_(digests),
                        BlobRow.sha256.not_in(select(ArtifactRow.sha256)),
                        BlobRow.sha256.not_in(select(AttachmentRow.sha256)),
                    )
                )

    # ------------------------------------------------------------------ turns

    async def claim_turn(
        self,
        session_id: str,
        task: str,
        *,
        idempotency_key: str | None = None,
        model: str | None = None,
        sandbox: str | None = None,
    ) -> tuple[TurnRow, bool]:
        """Record a new running turn, or return the turn that already owns ``idempotency_key``.

        Returns:
            ``(turn, created)``; ``created`` is false when the key named an existing turn.

        Raises:
            NotFoundError: unknown session.
            ConflictError: another turn is running in the session (``turn_id`` names it).
            ValidationError: the key already belongs to a turn with another task.
        """
        for _attempt in range(3):
            existing = await self._turn_by_key(session_id, idempotency_key)
            if existing is not None:
                if existing.task != task:
                    raise ValidationError(
                        "this Idempotency-Key already belongs to a turn with a different task; use a new key"
                    )
                return existing, False
            now = utcnow()
            try:
                async with self._write() as s:
                    ses = await s.get(SessionRow, session_id)
                    if ses is None:
                        raise NotFoundError(f"no session {session_id!r}; create one with POST /api/sessions")
                    if idempotency_key is not None and await s.scalar(
                        select(TurnRow.turn_id).where(
                            TurnRow.session_id == session_id, TurnRow.idempotency_key == idempotency_key
                        )
                    ):
                        # A concurrent request with the same key committed first: answer with its turn.
                        continue
                    running = await s.scalar(
                        select(TurnRow).where(TurnRow.session_id == session_id, TurnRow.status == "running")
                    )
                    if running is not None and abandoned(running, now):
                        _end_turn(s, running, "interrupted", _interrupted_error(running))
                        await s.flush()  # the old turn stops running before the new one starts
                    elif running is not None:
                        raise ConflictError(
                            f"turn {running.turn_id} is already running in this session; wait for it or cancel it",
                            turn_id=running.turn_id,
                            code="session_busy",
                        )
                    ses.turn_count += 1
                    ses.updated_at = now
                    if not ses.title:
                        ses.title = _title_from(task)
                    row = TurnRow(
                        turn_id=new_id("turn"),
                        run_id=new_id("run"),
                        session_id=session_id,
                        position=ses.turn_count,
                        idempotency_key=idempotency_key,
                        task=task,
                        status="running",
                        model=model,
                        sandbox=sandbox,
                        owner=PROCESS_OWNER,
                        started_at=now,
                        heartbeat_at=now,
                        last_seq=0,
                    )
                    s.add(row)
                return row, True
            except IntegrityError:
                continue  # a concurrent claim won the race: look again
        raise ConflictError("another request is starting a turn in this session; retry", code="session_busy")

    async def _turn_by_key(self, session_id: str, key: str | None) -> TurnRow | None:
        if key is None:
            return None
        async with self._read() as s:
            return await s.scalar(
                select(TurnRow).where(TurnRow.session_id == session_id, TurnRow.idempotency_key == key)
            )

    async def get_turn(self, turn_id: str, session_id: str | None = None) -> TurnRow:
        async with self._read() as s:
            row = await s.get(TurnRow, turn_id)
        if row is None or (session_id is not None and row.session_id != session_id):
            raise NotFoundError(f"no turn {turn_id!r} in this session")
        return row

    async def get_turn_by_run(self, run_id: str) -> TurnRow:
        async with self._read() as s:
            row = await s.scalar(select(TurnRow).where(TurnRow.run_id == run_id))
        if row is None:
            raise NotFoundError(f"no run {run_id!r}", code="run_not_found")
        return row

    async def list_turns(self, session_id: str) -> list[TurnRow]:
        await self.get_session(session_id)
        async with self._read() as s:
            rows = await s.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.position))
            return list(rows)

    async def running_turn(self, session_id: str) -> TurnRow | None:
        async with self._read() as s:
            return await s.scalar(
                select(TurnRow).where(TurnRow.session_id == session_id, TurnRow.status == "running")
            )

    async def history(self, session_id: str, *, window: int, before_position: int) -> list[TurnRow]:
        """The last ``window`` finished turns before ``before_position``, oldest first."""
        if window <= 0:
            return []
        async with self._read() as s:
            rows = await s.scalars(
                select(TurnRow)
                .where(
                    TurnRow.session_id == session_id,
                    TurnRow.position < before_position,
                    TurnRow.status != "running",
                )
                .order_by(TurnRow.position.desc())
                .limit(window)
            )
            return list(reversed(list(rows)))

    async def finish_turn(
        self,
        turn_id: str,
        status: str,
        *,
        answer: str | None = None,
        error: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        result: Any = None,
    ) -> None:
        async with self._write() as s:
            row = await s.get(TurnRow, turn_id)
            if row is None or row.status != "running":
                return
            row.status = status
            row.answer = answer
            row.result = result
            row.error = error
            row.usage = usage
            row.finished_at = utcnow()
            ses = await s.get(SessionRow, row.session_id)
            if ses is not None:
                ses.updated_at = row.finished_at

    async def beat(self, turn_ids: Iterable[str]) -> dict[str, str]:
        """Refresh the heartbeat of running turns; returns ``{turn_id: cancel_reason}`` for cancelled ones."""
        ids = list(turn_ids)
        if not ids:
            return {}
        async with self._write() as s:
            await s.execute(
                update(TurnRow)
                .where(TurnRow.turn_id.in_(ids), TurnRow.status == "running")
                .values(heartbeat_at=utcnow())
            )
            rows = await s.execute(
                select(TurnRow.turn_id, TurnRow.cancel_reason).where(
                    TurnRow.turn_id.in_(ids), TurnRow.cancel_requested_at.is_not(None)
                )
            )
            return {turn_id: reason or "cancelled" for turn_id, reason in rows}

    async def cancel_requests(self, turn_ids: Iterable[str]) -> dict[str, str]:
        """``{turn_id: reason}`` for those of ``turn_ids`` whose cancellation was requested."""
        ids = list(turn_ids)
        if not ids:
            return {}
        async with self._read() as s:
            rows = await s.execute(
                select(TurnRow.turn_id, TurnRow.cancel_reason).where(
                    TurnRow.turn_id.in_(ids), TurnRow.cancel_requested_at.is_not(None)
                )
            )
            return {turn_id: reason or "cancelled" for turn_id, reason in rows}

    async def request_cancel(self, run_id: str, reason: str = "cancelled by request") -> tuple[TurnRow, str]:
        """Record a durable cancellation; returns the turn and ``requested|already_requested|already_terminal``."""
        async with self._write() as s:
            row = await s.scalar(select(TurnRow).where(TurnRow.run_id == run_id))
            if row is None:
                raise NotFoundError(f"no run {run_id!r}", code="run_not_found")
            if row.status != "running":
                return row, "already_terminal"
            if row.cancel_requested_at is not None:
                return row, "already_requested"
            row.cancel_requested_at = utcnow()
            row.cancel_reason = reason
            return row, "requested"

    async def reap_stale_turns(self, stale_after: timedelta | None = None) -> list[str]:
        """Mark running turns whose owner is gone as ``interrupted``, each with its terminal event; returns their ids.

        An owner is gone when it is a dead process on this machine, or silent past its lease (see
        ``abandoned``); ``stale_after`` replaces that judgement by a plain heartbeat age. Reads first, so
        the frequent rounds that find nothing take no write lock.
        """

        def gone(row: TurnRow, now: datetime) -> bool:
            return now - row.heartbeat_at > stale_after if stale_after is not None else abandoned(row, now)

        async with self._read() as s:
            running = list(await s.scalars(select(TurnRow).where(TurnRow.status == "running")))
        candidates = [row.turn_id for row in running if gone(row, utcnow())]
        if not candidates:
            return []
        async with self._write() as s:
            rows = await s.scalars(select(TurnRow).where(TurnRow.turn_id.in_(candidates), TurnRow.status == "running"))
            now = utcnow()
            reaped = [row for row in rows if gone(row, now)]
            for row in reaped:
                _end_turn(s, row, "interrupted", _interrupted_error(row))
            return [row.turn_id for row in reaped]

    async def fail_turn(self, turn_id: str, error: dict[str, Any]) -> Event | None:
        """End a turn as ``failed`` with its terminal event right after its last committed one.

        For a turn some of whose events could not be committed: nothing after the gap is ever stored, and
        the stream still ends. Returns the terminal event, or ``None`` if the stream had ended already.
        """
        async with self._write() as s:
            row = await s.get(TurnRow, turn_id)
            if row is None:
                return None
            last = await s.scalar(
                select(EventRow.type).where(EventRow.turn_id == turn_id, EventRow.seq == row.last_seq)
            )
            if last in TERMINAL_TYPES:
                return None
            return _end_turn(s, row, "failed", error)

    async def check_writable(self) -> str | None:
        """``None`` if a write can be committed now, else what stops it (a full disk, a read-only or deleted file)."""
        path = self.engine.url.database if self.sqlite else None
        if path and path != ":memory:":
            if not os.path.exists(path):
                return f"the database file {path} was deleted or moved: restore it or restart Fleet"
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
            if free < MIN_FREE_BYTES:
                return f"the disk holding the store ({path}) is full ({free} bytes free): free space there"
        try:
            async with self._write() as s:  # a real write that changes nothing
                await s.execute(text("UPDATE alembic_version SET version_num = version_num"))
        except Exception as exc:  # noqa: BLE001 - health checks report, never raise
            return describe_write_error(exc, self.location)
        return None

    @property
    def location(self) -> str:
        """Where the store lives, for messages: the SQLite file, else the URL without its password."""
        path = self.engine.url.database if self.sqlite else None
        return os.path.abspath(path) if path and path != ":memory:" else self.safe_url

    # ------------------------------------------------------------------ events

    async def append_events(self, events: list[Event]) -> None:
        """Commit a batch of events of one or more turns in one transaction (the hot path)."""
        if not events:
            return
        if self._event_engine is not None:
            await asyncio.to_thread(self._append_blocking, events)
            return
        async with self._write_engine.begin() as conn:
            for statement, params in _event_statements(events):
                await conn.execute(statement, params)
            if not self.sqlite:
                await conn.execute(text(f"NOTIFY {EVENTS_CHANNEL}"))  # delivered when this commits

    @asynccontextmanager
    async def event_notifications(self, on_commit: Callable[[], None]) -> AsyncIterator[bool]:
        """Call ``on_commit`` whenever any process commits events, while the block runs.

        Yields whether it can: PostgreSQL over asyncpg does (``LISTEN`` on a connection held for the
        block); SQLite does not, and its readers watch the database files instead.
        """
        if self.sqlite:
            yield False
            return
        async with self.engine.connect() as conn:
            listener = (await conn.get_raw_connection()).driver_connection
            if not hasattr(listener, "add_listener"):  # a driver without notifications: readers poll
                yield False
                return

            def notified(*_: Any) -> None:
                on_commit()

            await listener.add_listener(EVENTS_CHANNEL, notified)
            try:
                yield True
            finally:
                await listener.remove_listener(EVENTS_CHANNEL, notified)

    def _append_blocking(self, events: list[Event]) -> None:
        """SQLite's hot path, on a worker thread: plain DB-API calls on a pooled connection.

        Per commit this spends a quarter of the CPU of the same statements through SQLAlchemy Core
        (0.1 ms against 0.45 ms, measured), and that CPU competes with the turn for the GIL.
        """
        assert self._event_engine is not None
        rows = [(e.turn_id, e.seq, e.session_id, e.type, e.agent_id, e.parent_agent_id, e.ts, json.dumps(e.data))
                for e in events]  # fmt: skip
        connection = self._event_engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                cursor.executemany(_INSERT_EVENTS, rows)
                cursor.executemany(_UPDATE_LAST_SEQ, [(seq, turn) for turn, seq in _last_seqs(events).items()])
                cursor.execute("COMMIT")
            except BaseException:
                if connection.driver_connection.in_transaction:  # SQLite rolls back by itself on a full disk
                    cursor.execute("ROLLBACK")
                raise
        finally:
            connection.close()  # back to the pool

    async def events_after(self, turn_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        async with self._read() as s:
            rows = await s.scalars(
                select(EventRow)
                .where(EventRow.turn_id == turn_id, EventRow.seq > after_seq)
                .order_by(EventRow.seq)
                .limit(limit)
            )
            return [_event(r) for r in rows]

    async def events_after_many(self, positions: dict[str, int], limit: int = 1000) -> list[Event]:
        """Events after each turn's seq in ``positions`` (``{turn_id: seq}``), in one query.

        One poll for every turn a process tails, however many turns and watchers there are.
        """
        if not positions:
            return []
        after = or_(*(and_(EventRow.turn_id == turn_id, EventRow.seq > seq) for turn_id, seq in positions.items()))
        async with self._read() as s:
            rows = await s.scalars(select(EventRow).where(after).order_by(EventRow.turn_id, EventRow.seq).limit(limit))
            return [_event(r) for r in rows]

    async def session_events(self, session_id: str) -> list[Event]:
        async with self._read() as s:
            rows = await s.scalars(
                select(EventRow)
                .join(TurnRow, TurnRow.turn_id == EventRow.turn_id)
                .where(EventRow.session_id == session_id)
                .order_by(TurnRow.position, EventRow.seq)
            )
            return [_event(r) for r in rows]

    async def count_events(self, turn_id: str) -> int:
        async with self._read() as s:
            return int(await s.scalar(select(func.count()).where(EventRow.turn_id == turn_id)) or 0)

    # ------------------------------------------------------------------ blobs, attachments, artifacts

    async def get_blob(self, sha256: str) -> bytes:
        async with self._read() as s:
            row = await s.get(BlobRow, sha256)
        if row is None:
            raise NotFoundError(f"no content {sha256}")
        return row.data

    async def _add_with_blob(self, row: AttachmentRow | ArtifactRow, data: bytes) -> None:
        """Insert a file's record and its bytes (stored once per sha256) in one transaction."""
        for attempt in range(2):
            try:
                async with self._write() as s:
                    if await s.get(BlobRow, row.sha256) is None:
                        s.add(BlobRow(sha256=row.sha256, size=len(data), data=data))
                    s.add(row)
                return
            except IntegrityError:
                if attempt:  # the same bytes were stored concurrently: the second try finds them
                    raise

    async def add_attachment(
        self, *, session_id: str | None, filename: str, path: str, mime: str, data: bytes
    ) -> AttachmentRow:
        row = AttachmentRow(
            attachment_id=new_id("att"), session_id=session_id, filename=filename, path=path, mime=mime,
            **_file_fields(data),
        )  # fmt: skip
        await self._add_with_blob(row, data)
        return row

    async def get_attachment(self, attachment_id: str) -> AttachmentRow:
        async with self._read() as s:
            row = await s.get(AttachmentRow, attachment_id)
        if row is None:
            raise NotFoundError(f"no attachment {attachment_id!r}")
        return row

    async def list_attachments(self, session_id: str) -> list[AttachmentRow]:
        async with self._read() as s:
            rows = await s.scalars(
                select(AttachmentRow).where(AttachmentRow.session_id == session_id).order_by(AttachmentRow.created_at)
            )
            return list(rows)

    async def add_artifact(
        self, *, session_id: str, turn_id: str, path: str, mime: str, data: bytes
    ) -> ArtifactRow:
        row = ArtifactRow(
            artifact_id=new_id("art"), session_id=session_id, turn_id=turn_id, path=path, mime=mime,
            **_file_fields(data),
        )  # fmt: skip
        await self._add_with_blob(row, data)
        return row

    async def get_artifact(self, artifact_id: str) -> ArtifactRow:
        async with self._read() as s:
            row = await s.get(ArtifactRow, artifact_id)
        if row is None:
            raise NotFoundError(f"no artifact {artifact_id!r}")
        return row

    async def list_artifacts(self, session_id: str, turn_id: str | None = None) -> list[ArtifactRow]:
        query = select(ArtifactRow).where(ArtifactRow.session_id == session_id)
        if turn_id is not None:
            query = query.where(ArtifactRow.turn_id == turn_id)
        async with self._read() as s:
            return list(await s.scalars(query.order_by(ArtifactRow.created_at)))

    async def latest_artifact_digests(self, session_id: str) -> dict[str, str]:
        """``{path: sha256}`` of the newest artifact recorded at each path in the session."""
        digests: dict[str, str] = {}
        for row in await self.list_artifacts(session_id):
            digests[row.path] = row.sha256
        return digests


def _interrupted_error(row: TurnRow) -> dict[str, Any]:
    return {
        "type": "interrupted",
        "message": f"the process running this turn ({row.owner}) stopped before it finished; run it again",
    }


def _end_turn(s: AsyncSession, row: TurnRow, status: str, error: dict[str, Any]) -> Event:
    """End a turn in the caller's transaction with one terminal ``turn.failed`` event (the stream contract)."""
    row.status = status
    row.finished_at = utcnow()
    row.error = error
    row.last_seq += 1
    event = EventRow(
        turn_id=row.turn_id,
        seq=row.last_seq,
        session_id=row.session_id,
        type=TurnFailed.type,
        agent_id=ROOT_AGENT,
        parent_agent_id=None,
        ts=utc_timestamp(),
        data={"error": error},
    )
    s.add(event)
    return _event(event)


def _event(row: EventRow) -> Event:
    return Event(
        seq=row.seq,
        type=row.type,  # type: ignore[arg-type]
        session_id=row.session_id,
        turn_id=row.turn_id,
        agent_id=row.agent_id,
        parent_agent_id=row.parent_agent_id,
        ts=row.ts,
        data=row.data,
    )


# Every public coroutine of the store runs to completion once started (see ``_uninterrupted``).
for _name, _method in list(vars(Store).items()):
    if not _name.startswith("_") and inspect.iscoroutinefunction(_method):
        setattr(Store, _name, _uninterrupted(_method))


_INSERT_EVENTS = (
    "INSERT INTO events (turn_id, seq, session_id, type, agent_id, parent_agent_id, ts, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPDATE_LAST_SEQ = "UPDATE turns SET last_seq = ? WHERE turn_id = ?"


def _last_seqs(events: list[Event]) -> dict[str, int]:
    last: dict[str, int] = {}
    for e in events:
        last[e.turn_id] = max(last.get(e.turn_id, 0), e.seq)
    return last


def _event_statements(events: list[Event]) -> list[tuple[Any, Any]]:
    """The insert of the events and the ``last_seq`` update of their turns, as Core statements."""
    rows = [
        {"turn_id": e.turn_id, "seq": e.seq, "session_id": e.session_id, "type": e.type, "agent_id": e.agent_id,
         "parent_agent_id": e.parent_agent_id, "ts": e.ts, "data": e.data}
        for e in events
    ]  # fmt: skip
    updates = [
        (update(TurnRow).where(TurnRow.turn_id == turn_id).values(last_seq=seq), None)
        for turn_id, seq in _last_seqs(events).items()
    ]
    return [(insert(EventRow), rows), *updates]


def _file_fields(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "created_at": utcnow()}


def _title_from(task: str) -> str:
    line = " ".join(task.strip().split())
    return line if len(line) <= 60 else line[:57] + "..."
