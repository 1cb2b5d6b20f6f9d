"""A turn whose owner is gone is taken over at once, on the real store: the owner is a real process
that has exited (this machine: its pid and start time say so), or one on another machine that stopped
renewing its 5 s lease. A live owner keeps its turn however busy it is."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from sqlalchemy import update

from fleet_kernel.errors import ConflictError
from fleet_kernel.events import Event, make_event
from fleet_kernel.store import LEASE, PROCESS_OWNER, EndedTurn, Store, TurnRow, utcnow


def _exited_owner() -> str:
    """The owner identity of a real Fleet process that has since exited."""
    code = "from fleet_kernel.store import PROCESS_OWNER; print(PROCESS_OWNER)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.strip()


async def _set_owner(store: Store, turn_id: str, owner: str, silent_for: timedelta = timedelta(0)) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(
            update(TurnRow).where(TurnRow.turn_id == turn_id).values(owner=owner, heartbeat_at=utcnow() - silent_for)
        )


async def test_a_turn_of_an_exited_process_gives_way_to_the_next_claim(store: Store) -> None:
    ses = await store.create_session()
    old, _ = await store.claim_turn(ses.session_id, "left running by a killed process")
    await _set_owner(store, old.turn_id, _exited_owner())  # its heartbeat is fresh: only the pid tells

    claim = await store.claim_turn(ses.session_id, "the next turn")

    new, created = claim
    assert created and new.turn_id != old.turn_id
    row = await store.get_turn(old.turn_id)
    assert row.status == "interrupted" and "stopped before it finished" in row.error["message"]
    # The store writes no event: it hands the ended turn, with the seq of its terminal event, to the caller.
    assert claim.interrupted == EndedTurn(old.turn_id, ses.session_id, 1, row.error)
    assert await store.events_after(old.turn_id) == []


@pytest.mark.slow
async def test_the_reaper_finds_an_exited_owner_without_waiting_for_a_lease(store: Store) -> None:
    ses = await store.create_session()
    old, _ = await store.claim_turn(ses.session_id, "t")
    await _set_owner(store, old.turn_id, _exited_owner())
    assert [t.turn_id for t in await store.reap_stale_turns()] == [old.turn_id]
    assert await store.reap_stale_turns() == []


async def test_an_owner_on_another_machine_keeps_its_turn_for_the_lease_only(store: Store) -> None:
    ses = await store.create_session()
    old, _ = await store.claim_turn(ses.session_id, "t")
    elsewhere = "another-machine:1234:1:1.1:abcdef01"
    await _set_owner(store, old.turn_id, elsewhere, silent_for=LEASE / 2)
    with pytest.raises(ConflictError):
        await store.claim_turn(ses.session_id, "too early")
    await _set_owner(store, old.turn_id, elsewhere, silent_for=LEASE + timedelta(seconds=1))
    claim = await store.claim_turn(ses.session_id, "after the lease")
    assert claim.created and (await store.get_turn(old.turn_id)).status == "interrupted"
    assert claim.interrupted is not None and claim.interrupted.turn_id == old.turn_id


async def test_a_live_owner_that_missed_a_few_beats_keeps_its_turn(store: Store) -> None:
    ses = await store.create_session()
    old, _ = await store.claim_turn(ses.session_id, "t")
    assert old.owner == PROCESS_OWNER
    await _set_owner(store, old.turn_id, PROCESS_OWNER, silent_for=LEASE * 2)  # this process lives
    with pytest.raises(ConflictError):
        await store.claim_turn(ses.session_id, "must wait")
    assert await store.reap_stale_turns() == []


async def test_a_turn_whose_events_were_lost_ends_right_after_the_last_stored_one(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    await store.append_events([_output(ses.session_id, turn.turn_id, seq) for seq in (1, 2)])
    error = {"type": "store_unwritable", "message": "the disk is full"}

    ended = await store.fail_turn(turn.turn_id, error)

    assert ended == EndedTurn(turn.turn_id, ses.session_id, 3, error)
    assert (await store.get_turn(turn.turn_id)).status == "failed"
    assert [e.seq for e in await store.events_after(turn.turn_id)] == [1, 2]  # the caller stores the event
    assert await store.fail_turn(turn.turn_id, error) == ended  # asked again before it is stored
    await store.append_events([make_event("turn.failed", {"error": error}, seq=3, session_id=ses.session_id,
                                          turn_id=turn.turn_id)])  # fmt: skip
    assert await store.fail_turn(turn.turn_id, error) is None


async def test_a_turn_another_process_ended_is_left_to_it(store: Store) -> None:
    ses = await store.create_session()
    turn, _ = await store.claim_turn(ses.session_id, "t")
    await store.append_events([_output(ses.session_id, turn.turn_id, 1)])
    [reaped] = [t for t in await store.reap_stale_turns(timedelta(seconds=-1)) if t.turn_id == turn.turn_id]
    assert reaped.seq == 2
    await _set_owner(store, turn.turn_id, "another-machine:1234:1:1.1:abcdef01")  # as if it had reaped the turn
    assert await store.fail_turn(turn.turn_id, {"type": "store_unwritable", "message": "m"}) is None
    assert (await store.get_turn(turn.turn_id)).status == "interrupted"


def _output(session_id: str, turn_id: str, seq: int) -> Event:
    return make_event("output", {"iteration": 1, "stream": "stdout", "text": "x"}, seq=seq, session_id=session_id,
                      turn_id=turn_id)  # fmt: skip
