"""The kernel's input history, served from the store: every session's tasks, newest last.

Jupyter's history protocol numbers entries ``(session, line)``; Fleet uses session 0 for the kernel's
current Fleet session and 1 for all others, and ``line`` as the turn's position in its session.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from fleet_kernel.store import Store, TurnRow

HistoryEntry = tuple[int, int, Any]
MAX_ENTRIES = 10_000


async def history(
    store: Store,
    session_id: str | None,
    access: str,
    *,
    n: int | None = None,
    pattern: str | None = None,
    unique: bool = False,
    session: Any = None,
    start: Any = None,
    stop: Any = None,
    output: bool = False,
) -> list[HistoryEntry]:
    """Entries for a ``history_request`` (``tail``, ``search`` or ``range``), oldest first.

    With ``output`` each entry's third item is ``(task, answer)`` instead of the task.
    """
    query = select(TurnRow.session_id, TurnRow.position, TurnRow.task, TurnRow.answer, TurnRow.status)
    query = query.order_by(TurnRow.started_at.desc())
    if access == "range":
        if session_id is None or session not in (0, None):
            return []
        query = query.where(TurnRow.session_id == session_id)
    query = query.limit(min(int(n or MAX_ENTRIES), MAX_ENTRIES) if access != "search" or not pattern else MAX_ENTRIES)
    async with AsyncSession(store.engine) as db:
        rows = list((await db.execute(query)).all())
    rows.reverse()
    entries: list[HistoryEntry] = [
        (0 if sid == session_id else 1, position, (task, answer or f"({status})") if output else task)
        for sid, position, task, answer, status in rows
    ]
    if access == "range":
        first, last = int(start or 0), int(stop) if stop else None
        entries = [e for e in entries if e[1] >= first and (last is None or e[1] < last)]
    if access == "search" and pattern:
        entries = [e for e in entries if fnmatch.fnmatchcase(_task(e), pattern)]
    if unique:
        newest_first: dict[str, HistoryEntry] = {}
        for entry in reversed(entries):
            newest_first.setdefault(_task(entry), entry)
        entries = list(reversed(newest_first.values()))
    if n and access != "range":
        entries = entries[-int(n) :]
    return entries


def _task(entry: HistoryEntry) -> str:
    value = entry[2]
    task: str = value[0] if isinstance(value, tuple) else value
    return task
