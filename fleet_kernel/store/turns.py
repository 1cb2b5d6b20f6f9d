"""Turns: claiming one (idempotently, one running turn per session), reading them, and the history a
turn sees (which turns stand in the notebook's cells, and which were forgotten).

The leases of running turns, their cancellation and the end of abandoned ones are ``leases``.
"""

from __future__ import annotations

from typing import Self

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleet_kernel.errors import ConflictError, NotFoundError, ValidationError
from fleet_kernel.store.cells import Lineage, TurnLine
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.leases import PROCESS_OWNER, EndedTurn, abandoned, interrupt
from fleet_kernel.store.models import SessionRow, TurnRow, new_id, utcnow
from fleet_kernel.store.sessions import session_of


class Claim(tuple[TurnRow, bool]):
    """What ``claim_turn`` did: the pair ``(turn, created)``; in ``interrupted`` the session's
    abandoned turn it ended to make room, whose terminal event the caller emits, and in ``session``
    the session as the new turn found it (``None`` exactly when the turn existed: not created)."""

    interrupted: EndedTurn | None
    session: SessionRow | None

    def __new__(
        cls,
        turn: TurnRow,
        created: bool,
        interrupted: EndedTurn | None = None,
        session: SessionRow | None = None,
    ) -> Self:
        claim = super().__new__(cls, (turn, created))
        claim.interrupted = interrupted
        claim.session = session
        return claim

    @property
    def turn(self) -> TurnRow:
        return self[0]

    @property
    def created(self) -> bool:
        return self[1]


class TurnStore(Repository):
    async def claim_turn(
        self,
        session_id: str,
        task: str,
        *,
        idempotency_key: str | None = None,
        model: str | None = None,
        sandbox: str | None = None,
        cell_id: str | None = None,
        supersedes_turn_id: str | None = None,
    ) -> Claim:
        """Record a new running turn, or return the turn that already owns ``idempotency_key``.

        ``model`` is recorded unless the session chose its own (as ``engine.session_config`` applies it).
        A running turn of the session whose owner is gone is ended ``interrupted`` in the same
        transaction and returned in ``Claim.interrupted``: the caller emits its terminal event.
        The turn supersedes ``supersedes_turn_id`` (and takes its cell id when it has none), else the
        latest turn of the session from the same ``cell_id`` (see ``cells``).

        Raises:
            NotFoundError: unknown session.
            ConflictError: another turn is running in the session (``turn_id`` names it).
            ValidationError: the key already belongs to a turn with another task, or
                ``supersedes_turn_id`` is not a turn of this session.
        """

        def claim(s: Session) -> Claim | None:
            """The new turn, or ``None`` when a concurrent request with the same key committed first."""
            now = utcnow()
            ses = s.get(SessionRow, session_id)
            if ses is None:
                raise NotFoundError(f"no session {session_id!r}; create one with POST /api/sessions")
            if idempotency_key is not None and s.scalar(
                select(TurnRow.turn_id).where(
                    TurnRow.session_id == session_id, TurnRow.idempotency_key == idempotency_key
                )
            ):
                return None
            running = s.scalar(
                select(TurnRow)
                .where(TurnRow.session_id == session_id, TurnRow.status == "running")
                .with_for_update()  # PostgreSQL: a concurrent reaper waits, then finds it ended
            )
            ours = running is not None and running.idempotency_key == idempotency_key
            if ours and idempotency_key is not None:
                return None  # committed since the check above (PostgreSQL reads each statement anew)
            interrupted = None
            if running is not None and abandoned(running, now):
                interrupted = interrupt(running)
                s.flush()  # the old turn stops running before the new one starts
            elif running is not None:
                raise ConflictError(
                    f"turn {running.turn_id} is already running in this session; wait for it or cancel it",
                    turn_id=running.turn_id,
                    code="session_busy",
                )
            supersedes, cell = _cell_of(s, session_id, cell_id, supersedes_turn_id)
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
                model=ses.model or model,
                sandbox=sandbox,
                owner=PROCESS_OWNER,
                started_at=now,
                heartbeat_at=now,
                last_seq=0,
                cell_id=cell,
                supersedes_turn_id=supersedes,
            )
            s.add(row)
            return Claim(row, True, interrupted, ses)

        for _attempt in range(3):
            existing = await self._turn_by_key(session_id, idempotency_key)
            if existing is not None:
                if existing.task != task:
                    raise ValidationError(
                        "this Idempotency-Key already belongs to a turn with a different task; use a new key"
                    )
                return Claim(existing, False)
            try:
                claimed = await self._write(claim)
            except IntegrityError:
                continue  # a concurrent claim won the race: look again
            if claimed is not None:
                return claimed
        raise ConflictError("another request is starting a turn in this session; retry", code="session_busy")

    async def _turn_by_key(self, session_id: str, key: str | None) -> TurnRow | None:
        if key is None:
            return None
        query = select(TurnRow).where(TurnRow.session_id == session_id, TurnRow.idempotency_key == key)
        return await self._read(lambda s: s.scalar(query))

    async def get_turn(self, turn_id: str, session_id: str | None = None) -> TurnRow:
        return await self._read(lambda s: _turn_of(s, turn_id, session_id))

    async def list_turns(self, session_id: str) -> list[TurnRow]:
        def read(s: Session) -> list[TurnRow]:
            session_of(s, session_id)
            return list(s.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.position)))

        return await self._read(read)

    async def lineage(self, session_id: str, *, before_position: int | None = None) -> Lineage:
        """The cells of the session's turns (before ``before_position``, when given). Raises ``NotFoundError``."""
        return await self._read(lambda s: lineage_of(s, session_id, before_position))

    async def history(self, session_id: str, *, window: int, before_position: int | None = None) -> list[TurnRow]:
        """The last ``window`` turns a turn at ``before_position`` sees (default: the next turn), in the
        order their cells first ran (see ``cells``)."""
        if window <= 0:
            return []

        def read(s: Session) -> list[TurnRow]:
            seen = lineage_of(s, session_id, before_position).history()[-window:]
            return rows_in_order(s, [line.turn_id for line in seen])

        return await self._read(read)

    async def standing_turns(self, session_id: str) -> list[TurnRow]:
        """One turn per cell, as the notebook stands (see ``Lineage.standing``)."""
        return await self._read(
            lambda s: rows_in_order(s, [line.turn_id for line in lineage_of(s, session_id).standing()])
        )

    async def set_in_history(self, session_id: str, turn_id: str, in_history: bool) -> TurnRow:
        """Forget a turn (later turns do not see it) or restore it; the time it was forgotten is recorded.

        Raises:
            NotFoundError: no such turn in the session.
            ConflictError: restoring a turn that still would not be seen (superseded, not completed,
                running), with the reason.
        """

        def update(s: Session) -> TurnRow:
            row = _turn_of(s, turn_id, session_id)
            if in_history:
                why = lineage_of(s, session_id).why_not_seen(turn_id)
                if why is not None:
                    raise ConflictError(f"{why}; it cannot be put back into the history", code="not_restorable")
                row.forgotten_at = None
            elif row.forgotten_at is None:
                row.forgotten_at = utcnow()
            return row

        return await self._write(update)


def _turn_of(s: Session, turn_id: str, session_id: str | None) -> TurnRow:
    row = s.get(TurnRow, turn_id)
    if row is None or (session_id is not None and row.session_id != session_id):
        raise NotFoundError(f"no turn {turn_id!r} in this session")
    return row


def lineage_of(s: Session, session_id: str, before_position: int | None = None) -> Lineage:
    session_of(s, session_id)
    query = select(
        TurnRow.turn_id, TurnRow.position, TurnRow.status, TurnRow.cell_id,
        TurnRow.supersedes_turn_id, TurnRow.forgotten_at,
    ).where(TurnRow.session_id == session_id)  # fmt: skip
    if before_position is not None:
        query = query.where(TurnRow.position < before_position)
    return Lineage(TurnLine(*row) for row in s.execute(query))


def rows_in_order(s: Session, turn_ids: list[str]) -> list[TurnRow]:
    if not turn_ids:
        return []
    rows = {row.turn_id: row for row in s.scalars(select(TurnRow).where(TurnRow.turn_id.in_(turn_ids)))}
    return [rows[turn_id] for turn_id in turn_ids]


def _cell_of(
    s: Session, session_id: str, cell_id: str | None, supersedes_turn_id: str | None
) -> tuple[str | None, str | None]:
    """``(supersedes_turn_id, cell_id)`` of a new turn: the turn it names, else its cell's latest turn."""
    if supersedes_turn_id is not None:
        earlier = s.get(TurnRow, supersedes_turn_id)
        if earlier is None or earlier.session_id != session_id:
            raise ValidationError(
                f"supersedes_turn_id {supersedes_turn_id!r} is not a turn of this session; "
                f"list them with GET /api/sessions/{session_id}/turns"
            )
        return earlier.turn_id, cell_id or earlier.cell_id
    if cell_id is None:
        return None, None
    latest = s.scalar(
        select(TurnRow.turn_id)
        .where(TurnRow.session_id == session_id, TurnRow.cell_id == cell_id)
        .order_by(TurnRow.position.desc())
        .limit(1)
    )
    return latest, cell_id


def _title_from(task: str) -> str:
    line = " ".join(task.strip().split())
    return line if len(line) <= 60 else line[:57] + "..."
