"""Sessions: create, read, rename, and delete with everything recorded in them."""

from __future__ import annotations

from sqlalchemy import delete, select

from fleet_kernel.errors import ConflictError, NotFoundError
from fleet_kernel.store.connection import Database
from fleet_kernel.store.models import ArtifactRow, AttachmentRow, BlobRow, EventRow, SessionRow, TurnRow, new_id, utcnow


class SessionStore(Database):
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
