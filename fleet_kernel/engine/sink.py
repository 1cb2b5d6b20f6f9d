"""From ``emit`` to durable, fanned-out events.

``TurnEmitter.emit`` may be called from any thread: it assigns the turn's gapless ``seq``, validates the
event and hands it to the process's ``EventWriter``. The writer commits in batches (a lone event at once,
a burst at most ``COMMIT_GAP_S`` later) and only then delivers each batch to in-process subscribers, so an
event anyone sees is already in the store. ``follow`` serves a turn to a reader in any process: replay
from the store, then live events from this process's hub, else by polling the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fleet_kernel.events import ROOT_AGENT, Event, EventData, LMFinished, TurnFailed, TurnStarted, make_event
from fleet_kernel.redact import Redactor
from fleet_kernel.store import Store, TurnEnding, describe_write_error
from fleet_kernel.telemetry import Telemetry

log = logging.getLogger(__name__)

# A lone event commits at once; in a burst, commits are at least this far apart, and what arrives in
# between (a step's reasoning, code, output; other turns' events) is committed together. The start and
# the end of a turn never wait. Each commit costs the process a thread hop, a transaction, metrics and a
# write to every stream, and that CPU competes with the turns for the GIL.
COMMIT_GAP_S = 0.025
POLL_INTERVAL_S = 0.05
REPLAY_PAGE = 1000  # events read from the store at once when a reader replays or catches up
# A batch is tried this many times (a moment apart) before its turns are stopped as unwritable.
COMMIT_ATTEMPTS = 3
# How often the terminal event of such a turn is offered to the store again, until it is stored.
FAIL_RETRY_S = 1.0


class EventHub:
    """In-process subscribers per turn. Lives on the event loop; only the writer publishes."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[Event]]] = defaultdict(set)
        # The turn.failed of a turn whose events could not be stored (a full disk), delivered but not yet
        # stored: readers who come meanwhile get it after what the store has, instead of waiting for ever.
        self.unstored: dict[str, Event] = {}

    def subscribe(self, turn_id: str) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers[turn_id].add(queue)
        return queue

    def unsubscribe(self, turn_id: str, queue: asyncio.Queue[Event]) -> None:
        subscribers = self._subscribers.get(turn_id)
        if subscribers is not None:
            subscribers.discard(queue)
            if not subscribers:
                del self._subscribers[turn_id]

    def publish(self, events: list[Event]) -> None:
        for event in events:
            for queue in self._subscribers.get(event.turn_id, ()):
                queue.put_nowait(event)


class EventWriter:
    """Commits events in batches, then publishes them. One per process and store.

    A batch that cannot be committed (a full disk, a read-only store) breaks its turns: nothing more of
    them is published, since a reader must never see an event after one that is not stored. Their
    owner hears of it (``on_broken``) and stops the turn; its terminal event is then replaced by one
    ``turn.failed`` right after the last committed event, stored as soon as the store takes writes again.
    """

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        *,
        on_broken: Callable[[str, dict[str, Any]], None] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry or Telemetry()  # metrics and traces: views of what is committed
        self.hub = hub
        self.on_broken = on_broken
        self._loop = asyncio.get_running_loop()
        # Events wait in one inbox (from any thread) until the writer takes them all. The loop is woken
        # once per commit, not once per event: only the first event after a commit and an urgent one
        # (``_is_urgent``) call into it, so a step's events do not each take the GIL from the turn.
        self._inbox: list[Event | None] = []  # None: close
        self._inbox_lock = threading.Lock()
        self._woken = False  # a wake-up is on its way, or the writer will look at the inbox before sleeping
        self._urgent = False  # the inbox holds an item that must not wait for the gap
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="fleet-event-writer")
        self._flushed: dict[str, asyncio.Event] = {}
        self._last_seq: dict[str, int] = {}  # committed so far, for turns still open
        self._progress: dict[str, asyncio.Event] = {}
        self._broken: dict[str, dict[str, Any]] = {}  # turn_id -> the error that stopped its events
        self._pending: set[asyncio.Task[None]] = set()  # terminal events waiting for the store to recover
        self._endings: dict[str, TurnEnding] = {}  # committed with the turn's terminal event
        self.last_error: str | None = None  # why the latest commit failed; None once one succeeds

    def put(self, event: Event, ending: TurnEnding | None = None) -> None:
        """Thread-safe: queue an event for commit; a terminal one with its turn's ``ending``, recorded in
        the same transaction (a broken turn's ending is dropped: it fails instead)."""
        if ending is not None:
            self._endings[event.turn_id] = ending
        self._add(event)

    def _add(self, item: Event | None) -> None:
        urgent = _is_urgent(item)
        with self._inbox_lock:
            self._inbox.append(item)
            self._urgent = self._urgent or urgent
            if self._woken and not urgent:
                return
            self._woken = True
        if threading.get_ident() == self._loop_thread_id():
            self._wake.set()
        else:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _loop_thread_id(self) -> int | None:
        return getattr(self._loop, "_thread_id", None)

    def failure(self, turn_id: str) -> dict[str, Any] | None:
        """The error that stopped a turn's events, if they could not all be committed."""
        return self._broken.get(turn_id)

    async def _run(self) -> None:
        last_commit = float("-inf")
        while True:
            await self._wake.wait()
            self._wake.clear()
            gap = last_commit + COMMIT_GAP_S - self._loop.time()
            if gap > 0 and not self._urgent:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), gap)  # an urgent event ends the wait
                self._wake.clear()
            with self._inbox_lock:
                items, self._inbox, self._urgent, self._woken = self._inbox, [], False, False
            last_commit = self._loop.time()
            stop = None in items
            batch = [item for item in items if item is not None]
            if batch:
                await self._commit(batch)
            if stop:
                return

    async def _commit(self, batch: list[Event]) -> None:
        for event in [e for e in batch if e.turn_id in self._broken and e.terminal]:
            self._endings.pop(event.turn_id, None)
            self._end_broken(event)
        batch = [e for e in batch if e.turn_id not in self._broken]
        if not batch:
            return
        endings = {e.turn_id: self._endings.pop(e.turn_id) for e in batch if e.terminal and e.turn_id in self._endings}
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                started = time.perf_counter()
                await self.store.append_events(batch, endings)
                self.last_error = None
                break
            except Exception as exc:  # noqa: BLE001 - a transient error is retried; a lasting one stops the turns
                log.exception("committing %d events failed (attempt %d)", len(batch), attempt + 1)
                error = describe_write_error(exc, self.store.location)
                if attempt + 1 < COMMIT_ATTEMPTS:
                    await asyncio.sleep(0.1 * (attempt + 1))
        else:
            self.last_error = error
            for event in batch:  # what is stored of each turn none of whose events this writer committed
                self._last_seq.setdefault(event.turn_id, event.seq - 1)
            self._break({e.turn_id for e in batch}, {"type": "store_unwritable", "message": error})
            for event in [e for e in batch if e.terminal]:
                self._end_broken(event)
            return
        self.hub.publish(batch)
        self.telemetry.committed(batch, time.perf_counter() - started)
        for event in batch:
            self._last_seq[event.turn_id] = max(self._last_seq.get(event.turn_id, 0), event.seq)
            if event.terminal:
                self._closed(event.turn_id)
        self._progressed({event.turn_id for event in batch})

    def _break(self, turn_ids: set[str], error: dict[str, Any]) -> None:
        for turn_id in turn_ids:
            self._broken[turn_id] = error
            if self.on_broken is not None:
                self.on_broken(turn_id, error)
        self._progressed(turn_ids)

    def _end_broken(self, terminal: Event) -> None:
        """Store and deliver the one terminal event of a broken turn (in place of ``terminal``), retrying
        until the store takes it."""
        task = self._loop.create_task(self._fail_durably(terminal), name=f"fleet-fail-{terminal.turn_id}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _fail_durably(self, terminal: Event) -> None:
        turn_id = terminal.turn_id
        error = self._broken[turn_id]
        delivered = False
        while True:
            try:
                event = await self._store_failed(terminal, error)
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the store is still unwritable: tell watchers here, retry
                self.last_error = describe_write_error(exc, self.store.location)
                if not delivered:  # the same event the store will hold: seq right after the last committed
                    delivered = True
                    self.hub.unstored[turn_id] = self._failed_event(terminal, error)
                    self._deliver_terminal(turn_id, self.hub.unstored[turn_id])
                await asyncio.sleep(FAIL_RETRY_S)
                continue
            if not delivered and event is not None:
                self._deliver_terminal(turn_id, event)
            elif not delivered:
                self._closed(turn_id)
            self._broken.pop(turn_id, None)
            self.hub.unstored.pop(turn_id, None)
            return

    async def _store_failed(self, terminal: Event, error: dict[str, Any]) -> Event | None:
        """End the turn as failed and store its ``turn.failed`` at the seq the store reserves for it;
        ``None`` if its stream had ended already (or another process ends it)."""
        ended = await self.store.fail_turn(terminal.turn_id, error)
        if ended is None:
            return None
        event = make_event(
            TurnFailed(error=ended.error), seq=ended.seq, session_id=ended.session_id, turn_id=ended.turn_id
        )
        await self.store.append_events([event])
        return event

    def _failed_event(self, terminal: Event, error: dict[str, Any]) -> Event:
        seq = self._last_seq.get(terminal.turn_id, 0) + 1
        return make_event(TurnFailed(error=error), seq=seq, session_id=terminal.session_id, turn_id=terminal.turn_id)

    def _deliver_terminal(self, turn_id: str, event: Event) -> None:
        self.hub.publish([event])
        self.telemetry.committed([event])
        self._closed(turn_id)

    def _closed(self, turn_id: str) -> None:
        self._last_seq.pop(turn_id, None)
        if turn_id in self._flushed:
            self._flushed.pop(turn_id).set()

    def _progressed(self, turn_ids: set[str]) -> None:
        for turn_id in turn_ids:
            if turn_id in self._progress:
                self._progress.pop(turn_id).set()

    async def wait_committed(self, turn_id: str, seq: int) -> None:
        """Return once event ``seq`` of an open turn is committed and delivered (or can never be)."""
        while self._last_seq.get(turn_id, 0) < seq and turn_id not in self._broken:
            await self._progress.setdefault(turn_id, asyncio.Event()).wait()

    def terminal_committed(self, turn_id: str) -> asyncio.Event:
        """An asyncio event set once the turn's terminal event is committed and delivered."""
        return self._flushed.setdefault(turn_id, asyncio.Event())

    async def close(self) -> None:
        self._add(None)
        await self._task
        for task in list(self._pending):  # the store stayed unwritable: the next start reaps those turns
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self.telemetry.close()


class TurnEmitter:
    """Assigns ``seq`` and builds envelopes for one turn, without the ``redactor``'s secrets; thread-safe."""

    def __init__(
        self,
        writer: EventWriter,
        *,
        session_id: str,
        turn_id: str,
        first_seq: int = 1,
        redactor: Redactor | None = None,
    ) -> None:
        self._writer = writer
        self._redactor = redactor  # every event loses the secrets in force (task, code, output, errors...)
        self.session_id = session_id
        self.turn_id = turn_id
        self._next_seq = first_seq
        self._lock = threading.Lock()
        self.closed = False
        self.lm_reported = False  # an ``lm.finished`` was emitted (every turn reports its LM step)

    def emit(
        self,
        data: EventData,
        *,
        agent_id: str = ROOT_AGENT,
        parent_agent_id: str | None = None,
        ending: TurnEnding | None = None,
    ) -> Event | None:
        """Record one event; after the terminal event the turn is closed and later events are dropped.

        ``ending`` goes with a terminal event: the turn's row is ended in the commit that stores it.
        """
        with self._lock:
            if self.closed:
                return None
            event = make_event(
                data,
                seq=self._next_seq,
                session_id=self.session_id,
                turn_id=self.turn_id,
                agent_id=agent_id,
                parent_agent_id=parent_agent_id,
            )
            self._next_seq += 1
            if self._redactor is not None:
                event = event.model_copy(update={"data": self._redactor.data(event.data)})
            self.lm_reported = self.lm_reported or isinstance(data, LMFinished)
            if event.terminal:
                self.closed = True
            self._writer.put(event, ending)
            return event


async def follow(
    store: Store,
    hub: EventHub | None,
    turn_id: str,
    after_seq: int = 0,
    *,
    idle_timeout_s: float = 5.0,
    quiet_s: float = POLL_INTERVAL_S,
) -> AsyncIterator[Event]:
    """Every event of a turn after ``after_seq``, in order, until the terminal one (``follow_batches``, one by one)."""
    batches = follow_batches(store, hub, turn_id, after_seq, idle_timeout_s=idle_timeout_s, quiet_s=quiet_s)
    async with aclosing(batches):
        async for batch in batches:
            for event in batch:
                yield event


async def follow_batches(  # noqa: C901 - one loop over replay, the hub and gaps; its invariants read together
    store: Store,
    hub: EventHub | None,
    turn_id: str,
    after_seq: int = 0,
    *,
    idle_timeout_s: float = 5.0,
    quiet_s: float = POLL_INTERVAL_S,
) -> AsyncGenerator[list[Event], None]:
    """Every event of a turn after ``after_seq``, in order, without gaps or duplicates, until the terminal one.

    Events come in the batches they were committed in, so a reader can pass each batch on in one write.
    Works for a turn running in this process (live from the hub), in another process (polling the store)
    or already finished (pure replay). A turn that is no longer running and has written nothing for
    ``idle_timeout_s`` ends the stream, so a reader never waits for ever on a dead writer. The store is
    read again whenever the hub stays quiet for ``quiet_s``: pass more than the default when something
    feeds the hub with every event of the turn (the writer for local turns, a store tail for others).
    """
    queue = hub.subscribe(turn_id) if hub is not None else None
    last = after_seq
    idle = 0.0
    replay = True  # read the store: at first, after a gap, and whenever the hub stays quiet
    try:
        while True:
            if replay:
                page = await store.events_after(turn_id, last, limit=REPLAY_PAGE)
                if page:
                    batch = _through_terminal(page)
                    yield batch
                    last = batch[-1].seq
                    if batch[-1].terminal:
                        return
                    idle = 0.0
                    if len(page) == REPLAY_PAGE:
                        continue  # there may be more than one page
                    # caught up: what is committed after the read reaches the queue, or the next poll
                elif hub is not None and (unstored := hub.unstored.get(turn_id)) and unstored.seq == last + 1:
                    yield [unstored]
                    return
                else:
                    idle += quiet_s if queue is not None else POLL_INTERVAL_S
                    if idle >= idle_timeout_s:
                        if (await store.get_turn(turn_id)).status != "running":
                            return
                        idle = 0.0
            if queue is None:
                await asyncio.sleep(POLL_INTERVAL_S)
                continue
            if queue.empty():
                try:
                    pending = [await asyncio.wait_for(queue.get(), quiet_s)]
                except TimeoutError:
                    replay = True
                    continue
            else:  # no timer and no task for what is already here
                pending = []
            while not queue.empty():
                pending.append(queue.get_nowait())
            replay = False
            batch = []
            for event in pending:
                if event.seq <= last:
                    continue
                if event.seq != last + 1:
                    replay = True  # a gap: the store has what we missed
                    break
                batch.append(event)
                last = event.seq
                if event.terminal:
                    break
            if batch:
                idle = 0.0
                yield batch
                if batch[-1].terminal:
                    return
    finally:
        if queue is not None and hub is not None:
            hub.unsubscribe(turn_id, queue)


def _is_urgent(item: Event | None) -> bool:
    """What commits without waiting for the gap: a turn's start, its end, and the writer's close."""
    return item is None or item.terminal or item.type == TurnStarted.type


def _through_terminal(events: list[Event]) -> list[Event]:
    ends = next((i for i, event in enumerate(events) if event.terminal), None)
    return events if ends is None else events[: ends + 1]
