"""The store rules the API relies on, raced from two independent Store objects (as two processes would),
on SQLite and, with FLEET_TEST_DATABASE_URL=postgresql+asyncpg://..., on PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import update

from fleet_kernel.config import Settings
from fleet_kernel.errors import ConflictError, ValidationError
from fleet_kernel.store import Store, TurnRow, utcnow


async def test_one_key_many_claimants_one_turn(store: Store, settings: Settings) -> None:
    other = await Store.open(settings.database_url)
    try:
        session = await store.create_session("race")
        claims = [s.claim_turn(session.session_id, "same task", idempotency_key="k") for s in (store, other) * 6]
        results = await asyncio.gather(*claims)
        assert len({turn.turn_id for turn, _ in results}) == 1
        assert sum(created for _, created in results) == 1
        assert (await store.get_session(session.session_id)).turn_count == 1
        with pytest.raises(ValidationError):
            await other.claim_turn(session.session_id, "another task", idempotency_key="k")
    finally:
        await other.close()


async def test_one_running_turn_per_session(store: Store, settings: Settings) -> None:
    other = await Store.open(settings.database_url)
    try:
        session = await store.create_session("race")
        claims = [s.claim_turn(session.session_id, f"task {i}") for i, s in enumerate((store, other) * 5)]
        results = await asyncio.gather(*claims, return_exceptions=True)
        created = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ConflictError)]
        assert len(created) == 1 and len(refused) == len(results) - 1
        assert all(e.turn_id in (None, created[0][0].turn_id) for e in refused)
    finally:
        await other.close()


async def test_cancellation_states(store: Store) -> None:
    session = await store.create_session("cancel")
    turn, _ = await store.claim_turn(session.session_id, "task")
    assert (await store.request_cancel(turn.run_id))[1] == "requested"
    assert (await store.request_cancel(turn.run_id))[1] == "already_requested"
    assert await store.cancel_requests([turn.turn_id]) == {turn.turn_id: "cancelled by request"}
    await store.finish_turn(turn.turn_id, "cancelled")
    assert (await store.request_cancel(turn.run_id))[1] == "already_terminal"


async def test_a_heartbeat_never_waits_for_a_turn_row_another_transaction_holds(
    store: Store, settings: Settings
) -> None:
    """The event writer updates its turns' ``last_seq`` while the heartbeat refreshes all of them: on
    PostgreSQL the two took the same row locks in different orders and deadlocked under load (100 turns
    at once). The heartbeat skips a row locked right now, and beats it on its next round."""
    if settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite locks the whole database for a writer: there are no row locks to wait for")
    busy, free = [(await store.claim_turn((await store.create_session()).session_id, "t"))[0] for _ in range(2)]
    async with store.engine.connect() as conn:
        await conn.begin()
        # what the writer's commit holds while it stores events of `busy`
        await conn.execute(update(TurnRow).where(TurnRow.turn_id == busy.turn_id).values(last_seq=0))
        before = utcnow()
        beat = asyncio.create_task(store.beat([busy.turn_id, free.turn_id]))
        # a liveness bound, not a timing: a heartbeat that waits for the lock never returns while it is held
        done, _ = await asyncio.wait({beat}, timeout=30)
        await conn.rollback()
        await beat
    assert done, "the heartbeat waited for a row lock another transaction held"
    assert (await store.get_turn(free.turn_id)).heartbeat_at >= before
    assert (await store.get_turn(busy.turn_id)).heartbeat_at < before  # skipped this round
    await store.beat([busy.turn_id, free.turn_id])
    assert (await store.get_turn(busy.turn_id)).heartbeat_at >= before
    async with store.engine.begin() as conn:  # no running turn left behind for a later reaper in this database
        ids = [busy.turn_id, free.turn_id]
        await conn.execute(update(TurnRow).where(TurnRow.turn_id.in_(ids)).values(status="cancelled"))
