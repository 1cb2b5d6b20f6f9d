"""Feedback: a user's mark on a turn's answer (good or bad, with a note), one per turn, the latest kept."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import FeedbackRow, TurnRow, utcnow

RATINGS = ("good", "bad")
MAX_NOTE_CHARS = 4000


class FeedbackStore(Repository):
    async def put_feedback(self, session_id: str, turn_id: str, rating: str, note: str = "") -> FeedbackRow:
        """Mark the turn's answer ``good`` or ``bad`` (replacing an earlier mark).

        Raises:
            ValidationError: another rating, a note over ``MAX_NOTE_CHARS``, or a turn that has not finished.
            NotFoundError: no such turn in the session.
        """
        if rating not in RATINGS:
            raise ValidationError(f"rating {rating!r} is not one of: good, bad")
        if len(note) > MAX_NOTE_CHARS:
            raise ValidationError(f"the note is {len(note)} characters; the limit is {MAX_NOTE_CHARS}")
        now = utcnow()

        def put(s: Session) -> FeedbackRow:
            turn = s.get(TurnRow, turn_id)
            if turn is None or turn.session_id != session_id:
                raise NotFoundError(f"no turn {turn_id!r} in session {session_id!r}")
            if turn.status == "running":
                raise ValidationError("the turn is still running: mark its answer once it has finished")
            row = s.get(FeedbackRow, turn_id)
            if row is None:
                row = FeedbackRow(turn_id=turn_id, session_id=session_id, created_at=now)
                s.add(row)
            row.rating, row.note, row.updated_at = rating, note, now
            return row

        return await self._write(put)

    async def get_feedback(self, session_id: str, turn_id: str) -> FeedbackRow:
        """Raises ``NotFoundError`` when the turn has no feedback."""
        row = await self._read(lambda s: s.get(FeedbackRow, turn_id))
        if row is None or row.session_id != session_id:
            raise NotFoundError(f"turn {turn_id!r} of session {session_id!r} has no feedback")
        return row

    async def list_feedback(self, session_id: str | None = None, rating: str | None = None) -> list[FeedbackRow]:
        """Feedback, oldest first; of one session, of one rating."""
        query = select(FeedbackRow).order_by(FeedbackRow.created_at, FeedbackRow.turn_id)
        if session_id is not None:
            query = query.where(FeedbackRow.session_id == session_id)
        if rating is not None:
            query = query.where(FeedbackRow.rating == rating)
        return await self._read(lambda s: list(s.scalars(query)))
