"""One store poll per process for turns that run elsewhere (a notebook kernel, another API process).

Without it every SSE watcher of such a turn polls the store on its own; with it, one task reads the
new events of every tailed turn in a single query and publishes them to the runner's in-process hub,
where ``follow`` picks them up exactly as it does for local turns. A hundred watchers of one turn cost
one query per tick.

When the tail queries: on PostgreSQL, when a commit of events is notified (``LISTEN``); on SQLite,
whose every commit appends to the ``-wal`` file, when that file's size or time changed (a ``stat``
every ``SQLITE_TICK_S``, microseconds); any other database every ``TAIL_INTERVAL_S``. And always once
every ``FULL_POLL_S``, in case a change slipped past.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fleet_kernel.engine.sink import EventHub
from fleet_kernel.store import Store

log = logging.getLogger("fleet_api")

TAIL_INTERVAL_S = 0.02
SQLITE_TICK_S = 0.004
FULL_POLL_S = 0.1


class StoreTail:
    """Tails the turns that watchers in this process follow but that do not run here."""

    def __init__(self, store: Store, hub: EventHub, interval_s: float = TAIL_INTERVAL_S) -> None:
        self.store = store
        self.hub = hub
        self.interval_s = interval_s
        self._positions: dict[str, int] = {}  # turn_id -> last seq published
        self._watchers: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._files = _sqlite_files(store)
        self._signature: tuple[tuple[int, int] | None, ...] = ()
        self._committed = asyncio.Event()  # set by PostgreSQL notifications

    @asynccontextmanager
    async def tailing(self, turn_id: str, committed_seq: int) -> AsyncIterator[None]:
        """Keep ``turn_id`` tailed while the block runs; ``committed_seq`` is its last seq already in the store."""
        self._watchers[turn_id] = self._watchers.get(turn_id, 0) + 1
        self._positions.setdefault(turn_id, committed_seq)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-store-tail")
        try:
            yield
        finally:
            self._watchers[turn_id] -= 1
            if not self._watchers[turn_id]:
                del self._watchers[turn_id]
                self._positions.pop(turn_id, None)

    async def _run(self) -> None:
        async with self.store.event_notifications(self._committed.set) as notified:
            queried = 0.0
            while self._watchers:
                if self._due(notified) or time.monotonic() - queried >= FULL_POLL_S:
                    queried = time.monotonic()
                    try:
                        await self._poll()
                    except Exception:  # a store hiccup: watchers still reread the store when the hub is quiet
                        log.warning("tailing the store failed; retrying", exc_info=True)
                        await asyncio.sleep(0.5)
                if notified:
                    with suppress(TimeoutError):
                        await asyncio.wait_for(self._committed.wait(), FULL_POLL_S)
                else:
                    await asyncio.sleep(SQLITE_TICK_S if self._files else self.interval_s)

    def _due(self, notified: bool) -> bool:
        """Whether new events may have been committed since the last query."""
        if notified:
            due = self._committed.is_set()
            self._committed.clear()
            return due
        return not self._files or self._changed()

    def _changed(self) -> bool:
        """Whether the SQLite files changed since the last look (a commit happened somewhere)."""
        signature = tuple(_stat(path) for path in self._files)
        changed = signature != self._signature
        self._signature = signature
        return changed

    async def _poll(self) -> None:
        positions = dict(self._positions)
        events = await self.store.events_after_many(positions)
        if not events:
            return
        for event in events:
            if event.turn_id in self._positions:
                self._positions[event.turn_id] = max(self._positions[event.turn_id], event.seq)
        self.hub.publish(events)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _sqlite_files(store: Store) -> tuple[str, ...]:
    """The database file and its write-ahead log, for a SQLite store on disk; empty otherwise."""
    database = store.sqlite_file
    return () if database is None else (database, database + "-wal")


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
