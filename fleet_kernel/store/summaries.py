"""History summaries: a session's rolling summary of the turns past its history window, and the one read a
turn's history is planned from (``engine/compaction.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import HistorySummaryRow, TurnRow, utcnow
from fleet_kernel.store.sessions import session_of
from fleet_kernel.store.turns import lineage_of, rows_in_order


@dataclass(frozen=True)
class HistoryRead:
    """What a turn's history is planned from, read in one transaction."""

    seen: list[str]
    """The ids of every turn a turn at that position sees, in order (``Lineage.history``)."""
    recent: list[TurnRow]
    """The last ``window`` of them, whole."""
    summary: HistorySummaryRow | None
    """The session's stored summary, whether or not it still stands."""


class SummaryStore(Repository):
    async def history_read(self, session_id: str, *, window: int, before_position: int | None = None) -> HistoryRead:
        """The turns a turn at ``before_position`` (default: the next turn) sees, the last ``window`` of them
        whole, and the stored summary. Raises ``NotFoundError``."""

        def read(s: Session) -> HistoryRead:
            seen = [line.turn_id for line in lineage_of(s, session_id, before_position).history()]
            recent = rows_in_order(s, seen[-window:]) if window > 0 else []
            return HistoryRead(seen, recent, s.get(HistorySummaryRow, session_id))

        return await self._read(read)

    async def turns_in_order(self, turn_ids: Sequence[str]) -> list[TurnRow]:
        """The turns of ``turn_ids``, in that order."""
        return await self._read(lambda s: rows_in_order(s, list(turn_ids)))

    async def history_summary(self, session_id: str) -> HistorySummaryRow | None:
        return await self._read(lambda s: s.get(HistorySummaryRow, session_id))

    async def put_history_summary(
        self, session_id: str, text: str, covers: Sequence[str], model: str | None
    ) -> HistorySummaryRow:
        """Keep ``text`` as the session's summary of the turns ``covers`` (oldest first), replacing the last.

        Raises ``NotFoundError`` for an unknown session."""

        def put(s: Session) -> HistorySummaryRow:
            session_of(s, session_id)
            row = s.get(HistorySummaryRow, session_id)
            if row is None:
                row = HistorySummaryRow(session_id=session_id)
                s.add(row)
            row.text, row.covers, row.model, row.updated_at = text, list(covers), model, utcnow()
            return row

        return await self._write(put)
