"""Turns: claims, leases and their owners' liveness, heartbeats, cancellation, and the end of turns
whose owner is gone.

The store records no event: ending a turn on the engine's behalf (its owner is gone, or its events
could not all be stored) reserves the seq of its terminal event in the turn row, makes this process
the turn's owner, and returns it (``EndedTurn``); the engine emits that event through its one writer,
which validates it and delivers it to watchers in the process as well. Only the transaction that moved
the turn out of ``running`` returns it, so however many processes reap at once, one event is emitted.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self

import psutil
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleet_kernel.errors import ConflictError, NotFoundError, ValidationError
from fleet_kernel.events import TERMINAL_TYPES
from fleet_kernel.store.cells import Lineage, TurnLine
from fleet_kernel.store.models import EventRow, SessionRow, TurnRow, new_id, utcnow
from fleet_kernel.store.sessions import SessionStore, session_of

# The lease of a running turn: its owner beats every 0.5 s, and a turn whose owner has not beaten for
# this long is taken for dead (a process on another machine, or one whose liveness cannot be checked).
LEASE = timedelta(seconds=5)
# An owner on this machine is checked directly (pid and start time): a dead one loses its turns at once,
# a live one only after this long without a beat (a hung process), so a busy machine never loses a turn.
HUNG_AFTER = timedelta(seconds=30)


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


@dataclass(frozen=True)
class EndedTurn:
    """A turn the store has ended whose terminal event is not stored yet: the engine emits it, a
    ``turn.failed`` with ``error``, at ``seq``."""

    turn_id: str
    session_id: str
    seq: int
    error: dict[str, Any]


class Claim(tuple[TurnRow, bool]):
    """What ``claim_turn`` did: the pair ``(turn, created)``; in ``interrupted`` the session's
    abandoned turn it ended to make room, whose terminal event the caller emits, and in ``session``
    the session as the new turn found it (``None`` when the turn existed)."""

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


class TurnStore(SessionStore):
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
                interrupted = _interrupt(running)
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

    async def beat(self, turn_ids: Iterable[str]) -> dict[str, str]:
        """Refresh the heartbeat of running turns; returns ``{turn_id: cancel_reason}`` for cancelled ones."""
        ids = list(turn_ids)
        if not ids:
            return {}

        def beat(s: Session) -> dict[str, str]:
            # On PostgreSQL the rows are locked first, skipping any another transaction holds now (this
            # process's event writer updating that turn's last_seq): an UPDATE of them all waited for
            # those locks in its own order while the writer waited for ours, a deadlock under load.
            # A skipped turn is beaten on the next round, well within its lease.
            free = s.scalars(
                select(TurnRow.turn_id)
                .where(TurnRow.turn_id.in_(ids), TurnRow.status == "running")
                .order_by(TurnRow.turn_id)
                .with_for_update(skip_locked=True)
            ).all()
            if free:
                s.execute(update(TurnRow).where(TurnRow.turn_id.in_(free)).values(heartbeat_at=utcnow()))
            return _cancel_requests(s, ids)

        return await self._write(beat)

    async def cancel_requests(self, turn_ids: Iterable[str]) -> dict[str, str]:
        """``{turn_id: reason}`` for those of ``turn_ids`` whose cancellation was requested."""
        ids = list(turn_ids)
        if not ids:
            return {}
        return await self._read(lambda s: _cancel_requests(s, ids))

    async def request_cancel(self, run_id: str, reason: str = "cancelled by request") -> tuple[TurnRow, str]:
        """Record a durable cancellation; returns the turn and ``requested|already_requested|already_terminal``."""

        def request(s: Session) -> tuple[TurnRow, str]:
            row = s.scalar(select(TurnRow).where(TurnRow.run_id == run_id))
            if row is None:
                raise NotFoundError(f"no run {run_id!r}", code="run_not_found")
            if row.status != "running":
                return row, "already_terminal"
            if row.cancel_requested_at is not None:
                return row, "already_requested"
            row.cancel_requested_at = utcnow()
            row.cancel_reason = reason
            return row, "requested"

        return await self._write(request)

    async def reap_stale_turns(self, stale_after: timedelta | None = None) -> list[EndedTurn]:
        """End running turns whose owner is gone as ``interrupted``; returns them, for the caller to emit
        each one's terminal event.

        An owner is gone when it is a dead process on this machine, or silent past its lease (see
        ``abandoned``); ``stale_after`` replaces that judgement by a plain heartbeat age. Reads first, so
        the frequent rounds that find nothing take no write lock.
        """

        def gone(row: TurnRow, now: datetime) -> bool:
            return now - row.heartbeat_at > stale_after if stale_after is not None else abandoned(row, now)

        running = await self._read(lambda s: list(s.scalars(select(TurnRow).where(TurnRow.status == "running"))))
        candidates = [row.turn_id for row in running if gone(row, utcnow())]
        if not candidates:
            return []

        def reap(s: Session) -> list[EndedTurn]:
            rows = s.scalars(
                select(TurnRow)
                .where(TurnRow.turn_id.in_(candidates), TurnRow.status == "running")
                .with_for_update()  # PostgreSQL: a concurrent reaper waits, then finds them ended
            )
            now = utcnow()
            return [_interrupt(row) for row in rows if gone(row, now)]

        return await self._write(reap)

    async def fail_turn(self, turn_id: str, error: dict[str, Any]) -> EndedTurn | None:
        """End a turn as ``failed`` right after its last committed event; returns it, for the caller to
        store its terminal event, or ``None`` if its stream has ended already.

        For a turn some of whose events could not be committed: nothing after the gap is ever stored. A
        turn this process ended before without its terminal event being stored (an earlier call, or a
        reap) is returned as it was ended; one another process ended is that process's to finish.
        """

        def fail(s: Session) -> EndedTurn | None:
            row = s.scalar(select(TurnRow).where(TurnRow.turn_id == turn_id).with_for_update())
            if row is None:
                return None
            last = s.scalar(select(EventRow.type).where(EventRow.turn_id == turn_id, EventRow.seq == row.last_seq))
            if last in TERMINAL_TYPES:
                return None
            if row.status == "running" or last is not None or row.last_seq == 0:
                return _end(row, "failed", error)
            if row.owner != PROCESS_OWNER:  # its terminal seq is reserved, and another process emits it
                return None
            return EndedTurn(row.turn_id, row.session_id, row.last_seq, row.error or error)

        return await self._write(fail)


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


def _cancel_requests(s: Session, ids: list[str]) -> dict[str, str]:
    rows = s.execute(
        select(TurnRow.turn_id, TurnRow.cancel_reason).where(
            TurnRow.turn_id.in_(ids), TurnRow.cancel_requested_at.is_not(None)
        )
    )
    return {turn_id: reason or "cancelled" for turn_id, reason in rows}


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


def _end(row: TurnRow, status: str, error: dict[str, Any]) -> EndedTurn:
    """End a turn in the caller's transaction, reserving the seq of its terminal event for this process."""
    row.status = status
    row.finished_at = utcnow()
    row.error = error
    row.owner = PROCESS_OWNER
    row.last_seq += 1
    return EndedTurn(row.turn_id, row.session_id, row.last_seq, error)


def _interrupt(row: TurnRow) -> EndedTurn:
    error = {
        "type": "interrupted",
        "message": f"the process running this turn ({row.owner}) stopped before it finished; run it again",
    }
    return _end(row, "interrupted", error)


def _title_from(task: str) -> str:
    line = " ".join(task.strip().split())
    return line if len(line) <= 60 else line[:57] + "..."
