"""The store tail: one query for the new events of many turns, published to the hub for watchers."""

from __future__ import annotations

import asyncio

from fleet_api.tail import StoreTail
from fleet_kernel.engine.sink import EventHub
from fleet_kernel.events import make_event
from fleet_kernel.store import Store


async def add_turn(store: Store, events: int) -> tuple[str, str]:
    session = await store.create_session("tail")
    turn, _ = await store.claim_turn(session.session_id, "task")
    await store.append_events(
        [
            make_event(
                "reasoning",
                {"iteration": 1, "text": str(i)},
                seq=i,
                session_id=session.session_id,
                turn_id=turn.turn_id,
            )
            for i in range(1, events + 1)
        ]
    )
    return session.session_id, turn.turn_id


async def test_events_after_many(store: Store) -> None:
    (_, a), (_, b) = await add_turn(store, 5), await add_turn(store, 3)
    found = await store.events_after_many({a: 2, b: 0})
    assert [(e.turn_id, e.seq) for e in found if e.turn_id == a] == [(a, 3), (a, 4), (a, 5)]
    assert [e.seq for e in found if e.turn_id == b] == [1, 2, 3]
    assert await store.events_after_many({a: 5, b: 3}) == []
    assert await store.events_after_many({}) == []


async def test_tail_publishes_new_events_once(store: Store) -> None:
    session_id, turn_id = await add_turn(store, 2)
    hub = EventHub()
    queue = hub.subscribe(turn_id)
    tail = StoreTail(store, hub, interval_s=0.01)
    async with tail.tailing(turn_id, committed_seq=2), tail.tailing(turn_id, committed_seq=2):
        await store.append_events(
            [make_event("reasoning", {"iteration": 1, "text": "x"}, seq=3, session_id=session_id, turn_id=turn_id)]
        )
        event = await asyncio.wait_for(queue.get(), 2)
        assert event.seq == 3
        await asyncio.sleep(0.1)
        assert queue.empty()  # two watchers, one publication
    await tail.close()
    assert tail._watchers == {} and tail._positions == {}


async def test_sqlite_commits_are_noticed_without_a_query(store: Store) -> None:
    tail = StoreTail(store, EventHub())
    if not store.sqlite:
        assert tail._files == ()  # other databases are queried on a timer
        return
    tail._changed()
    assert not tail._changed()
    await add_turn(store, 1)
    assert tail._changed() and not tail._changed()
