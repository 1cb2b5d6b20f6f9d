"""Leases of running turns: who owns one and whether that owner lives, heartbeats, durable cancellation,
and the end of turns whose owner is gone.

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
from typing import Any

import psutil
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fleet_kernel.errors import NotFoundError
from fleet_kernel.events import TERMINAL_TYPES
from fleet_kernel.store.connection import Repository
from fleet_kernel.store.models import EventRow, TurnRow, utcnow

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


class LeaseStore(Repository):
    """Heartbeats, durable cancellation requests and the end of turns whose owner is gone."""

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
            return [interrupt(row) for row in rows if gone(row, now)]

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
                return end_turn(row, "failed", error)
            if row.owner != PROCESS_OWNER:  # its terminal seq is reserved, and another process emits it
                return None
            return EndedTurn(row.turn_id, row.session_id, row.last_seq, row.error or error)

        return await self._write(fail)


def _cancel_requests(s: Session, ids: list[str]) -> dict[str, str]:
    rows = s.execute(
        select(TurnRow.turn_id, TurnRow.cancel_reason).where(
            TurnRow.turn_id.in_(ids), TurnRow.cancel_requested_at.is_not(None)
        )
    )
    return {turn_id: reason or "cancelled" for turn_id, reason in rows}


def end_turn(row: TurnRow, status: str, error: dict[str, Any]) -> EndedTurn:
    """End a turn in the caller's transaction, reserving the seq of its terminal event for this process."""
    row.status = status
    row.finished_at = utcnow()
    row.error = error
    row.owner = PROCESS_OWNER
    row.last_seq += 1
    return EndedTurn(row.turn_id, row.session_id, row.last_seq, error)


def interrupt(row: TurnRow) -> EndedTurn:
    error = {
        "type": "interrupted",
        "message": f"the process running this turn ({row.owner}) stopped before it finished; run it again",
    }
    return end_turn(row, "interrupted", error)
