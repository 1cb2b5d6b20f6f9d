"""Sessions: create, read, rename, and delete with everything recorded in them."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import and_, delete, exists, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleet_kernel.errors import ConflictError, NotFoundError, ValidationError
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import ArtifactRow, AttachmentRow, BlobRow, EventRow, SessionRow, TurnRow, new_id, utcnow

MAX_PAGE = 1000
Archived = Literal["false", "true", "all"]
_UNSET: Any = object()


@dataclass(frozen=True)
class SessionPage:
    """One page of sessions, newest first, and the cursor of the next page (``None`` at the end)."""

    sessions: list[SessionRow]
    next_cursor: str | None


def _cursor(row: SessionRow) -> str:
    raw = f"{row.created_at.isoformat()}|{row.session_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, session_id = raw.split("|", 1)
        return datetime.fromisoformat(moment), session_id
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValidationError(
            "the cursor is not one this API gave: pass the next_cursor of the previous page, or none"
        ) from exc


class SessionStore(Repository):
    async def create_session(self, title: str = "", session_id: str | None = None) -> SessionRow:
        """A new session; ``session_id`` names it (a client-chosen id), else a fresh ``ses_`` one.

        Raises:
            ConflictError: a session of that id exists (or was created concurrently).
        """
        now = utcnow()
        row = SessionRow(
            session_id=session_id or new_id("ses"), title=title[:200], created_at=now, updated_at=now, turn_count=0
        )
        try:
            await self._write(lambda s: s.add(row))
        except IntegrityError:
            raise ConflictError(f"session {row.session_id!r} already exists", code="session_exists") from None
        return row

    async def get_session(self, session_id: str) -> SessionRow:
        return await self._read(lambda s: session_of(s, session_id))

    async def list_sessions(self, limit: int = 200) -> list[SessionRow]:
        query = select(SessionRow).order_by(SessionRow.updated_at.desc()).limit(limit)
        return await self._read(lambda s: list(s.scalars(query)))

    async def page_sessions(
        self, *, limit: int = 50, cursor: str | None = None, q: str | None = None, archived: Archived = "false"
    ) -> SessionPage:
        """Sessions newest first (by creation), ``limit`` at a time after ``cursor``.

        ``q`` matches, case-insensitively, the title or the task of any of the session's turns;
        ``archived`` is ``"false"`` (the default: archived ones hidden), ``"true"`` (only those) or ``"all"``.

        Raises:
            ValidationError: a cursor this store did not give, or a bad ``limit``/``archived``.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise ValidationError(f"limit must be between 1 and {MAX_PAGE}; got {limit}")
        if archived not in ("false", "true", "all"):
            raise ValidationError(f"archived must be true, false or all; got {archived!r}")
        query = select(SessionRow)
        if archived != "all":
            query = query.where(SessionRow.archived == (archived == "true"))
        if q and q.strip():
            needle = q.strip().lower()
            in_tasks = exists().where(
                TurnRow.session_id == SessionRow.session_id, func.lower(TurnRow.task).contains(needle, autoescape=True)
            )
            query = query.where(or_(func.lower(SessionRow.title).contains(needle, autoescape=True), in_tasks))
        if cursor:
            moment, session_id = _after(cursor)
            query = query.where(
                or_(SessionRow.created_at < moment,
                    and_(SessionRow.created_at == moment, SessionRow.session_id < session_id))
            )  # fmt: skip
        query = query.order_by(SessionRow.created_at.desc(), SessionRow.session_id.desc()).limit(limit + 1)
        rows = await self._read(lambda s: list(s.scalars(query)))
        more = len(rows) > limit
        rows = rows[:limit]
        return SessionPage(rows, _cursor(rows[-1]) if more else None)

    async def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        archived: bool | None = None,
        model: str | None = _UNSET,
        sub_model: str | None = _UNSET,
    ) -> SessionRow:
        """Change what is given: the title, whether it is archived, and its models (``None`` for the
        configured one). Raises ``NotFoundError``."""  # fmt: skip

        def update(s: Session) -> SessionRow:
            row = s.get(SessionRow, session_id)
            if row is None:
                raise NotFoundError(f"no session {session_id!r}")
            if title is not None:
                row.title = title[:200]
            if archived is not None:
                row.archived = archived
            if model is not _UNSET:
                row.model = model or None
            if sub_model is not _UNSET:
                row.sub_model = sub_model or None
            row.updated_at = utcnow()
            return row

        return await self._write(update)

    async def running_turn_id(self, session_id: str) -> str | None:
        """The turn running in the session now, if any."""
        return await self._read(lambda s: _running_turn_id(s, session_id))

    async def rename_session(self, session_id: str, title: str) -> SessionRow:
        return await self.update_session(session_id, title=title)

    async def delete_session(self, session_id: str) -> None:
        """Delete a session with its turns, events, attachments and artifacts.

        Raises:
            ConflictError: a turn is running in it.
        """
        await self._write(lambda s: _delete_session(s, session_id))


def session_of(s: Session, session_id: str) -> SessionRow:
    """The session, in the caller's transaction. Raises ``NotFoundError``."""
    row = s.get(SessionRow, session_id)
    if row is None:
        raise NotFoundError(f"no session {session_id!r}; list sessions with GET /api/sessions")
    return row


def _running_turn_id(s: Session, session_id: str) -> str | None:
    return s.scalar(select(TurnRow.turn_id).where(TurnRow.session_id == session_id, TurnRow.status == "running"))


def _delete_session(s: Session, session_id: str) -> None:
    row = s.get(SessionRow, session_id)
    if row is None:
        raise NotFoundError(f"no session {session_id!r}")
    running = _running_turn_id(s, session_id)
    if running:
        raise ConflictError(
            f"turn {running} is running in this session; cancel it or wait for it to finish",
            turn_id=running,
            code="session_busy",
        )
    turn_ids = select(TurnRow.turn_id).where(TurnRow.session_id == session_id)
    digests = set(s.scalars(select(ArtifactRow.sha256).where(ArtifactRow.session_id == session_id)))
    digests |= set(s.scalars(select(AttachmentRow.sha256).where(AttachmentRow.session_id == session_id)))
    s.execute(delete(EventRow).where(EventRow.turn_id.in_(turn_ids)))
    s.execute(delete(ArtifactRow).where(ArtifactRow.session_id == session_id))
    s.execute(delete(AttachmentRow).where(AttachmentRow.session_id == session_id))
    s.execute(delete(TurnRow).where(TurnRow.session_id == session_id))
    s.delete(row)
    # Their bytes go too, unless another session's attachment or artifact has the same content.
    if digests:
        s.execute(
            delete(BlobRow).where(
                BlobRow.sha256.in_(digests),
                BlobRow.sha256.not_in(select(ArtifactRow.sha256)),
                BlobRow.sha256.not_in(select(AttachmentRow.sha256)),
            )
        )
