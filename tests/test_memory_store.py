"""Memories and the session list in the store, on a real database (SQLite, or PostgreSQL)."""

from __future__ import annotations

import pytest

from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.store import Store, new_id

CAPS = {"max_chars": 200, "max_count": 3}


async def test_memories_are_searched_by_words_within_their_session(store: Store) -> None:
    ses = await store.create_session("a")
    other = await store.create_session("b")
    cats = await store.put_memory(ses.session_id, "The user's cat is called Miso", kind="fact", **CAPS)
    await store.put_memory(ses.session_id, "Prefers tables over charts", kind="preference", **CAPS)
    await store.put_memory(other.session_id, "Another session's cat", **CAPS)

    found = await store.search_memories(ses.session_id, "what is the CAT called?")
    assert [m.memory_id for m in found] == [cats.memory_id]
    assert found[0].to_dict()["kind"] == "fact"
    assert [m.content for m in await store.search_memories(ses.session_id, "tabl")] == ["Prefers tables over charts"]
    assert await store.search_memories(ses.session_id, "dog") == []
    assert await store.search_memories(ses.session_id, '"*) OR (') == []  # query syntax is never passed through


async def test_memories_are_replaced_forgotten_and_capped(store: Store) -> None:
    ses = await store.create_session()
    first = await store.put_memory(ses.session_id, "old text", memory_id="plan", **CAPS)
    assert first.memory_id == "plan"
    await store.put_memory(ses.session_id, "new text", memory_id="plan", **CAPS)
    assert [m.content for m in await store.list_memories(ses.session_id)] == ["new text"]
    assert await store.search_memories(ses.session_id, "old") == []
    assert [m.memory_id for m in await store.search_memories(ses.session_id, "new")] == ["plan"]

    with pytest.raises(ValidationError, match="memory.max_chars"):
        await store.put_memory(ses.session_id, "x" * 201, **CAPS)
    with pytest.raises(ValidationError, match="empty"):
        await store.put_memory(ses.session_id, "  ", **CAPS)
    with pytest.raises(ValidationError, match="kind"):
        await store.put_memory(ses.session_id, "text", kind="Not A Kind!", **CAPS)
    await store.put_memory(ses.session_id, "two", **CAPS)
    await store.put_memory(ses.session_id, "three", **CAPS)
    with pytest.raises(ValidationError, match="memory.max_count"):
        await store.put_memory(ses.session_id, "four", **CAPS)
    with pytest.raises(NotFoundError):
        await store.put_memory("ses_missing", "text", **CAPS)

    assert await store.forget_memory(ses.session_id, "plan") is True
    assert await store.forget_memory(ses.session_id, "plan") is False
    assert await store.search_memories(ses.session_id, "new") == []


async def test_deleting_a_session_deletes_its_memories(store: Store) -> None:
    ses = await store.create_session()
    mem = await store.put_memory(ses.session_id, "remember the milk", **CAPS)
    await store.delete_session(ses.session_id)
    again = await store.create_session()
    await store.put_memory(again.session_id, "milk again", **CAPS)
    assert [m.content for m in await store.search_memories(again.session_id, "milk")] == ["milk again"]
    with pytest.raises(NotFoundError):
        await store.get_memory(ses.session_id, mem.memory_id)


async def test_sessions_page_newest_first_with_search_and_archive(store: Store) -> None:
    tag = new_id("t")  # a PostgreSQL test database keeps other tests' sessions: only ours are looked at
    made = [await store.create_session(f"{tag} session {i:03d}") for i in range(25)]
    ours = {s.session_id for s in made}
    claimed, _ = await store.claim_turn(made[3].session_id, "Plot the QUARTERLY revenue")
    await store.finish_turn(claimed.turn_id, "completed", answer="done")
    await store.update_session(made[5].session_id, archived=True)

    seen, cursor = [], None
    while True:
        page = await store.page_sessions(limit=10, cursor=cursor)
        seen += [s.session_id for s in page.sessions if s.session_id in ours]
        cursor = page.next_cursor
        if cursor is None:
            break
    expected = [s.session_id for s in reversed(made) if s.session_id != made[5].session_id]
    assert seen == expected

    assert [s.session_id for s in (await store.page_sessions(q="quarterly")).sessions if s.session_id in ours] == [
        made[3].session_id
    ]
    assert [s.session_id for s in (await store.page_sessions(q=f"{tag} SESSION 007")).sessions] == [made[7].session_id]
    assert [s.session_id for s in (await store.page_sessions(archived="true", q=tag)).sessions] == [made[5].session_id]
    assert len((await store.page_sessions(archived="all", q=tag)).sessions) == 25
    with pytest.raises(ValidationError, match="cursor"):
        await store.page_sessions(cursor="not-a-cursor")

    updated = await store.update_session(made[0].session_id, model="openai/gpt-x", sub_model="openai/gpt-y")
    assert (updated.model, updated.sub_model) == ("openai/gpt-x", "openai/gpt-y")
    assert (await store.update_session(made[0].session_id, model=None)).model is None
    assert (await store.get_session(made[0].session_id)).sub_model == "openai/gpt-y"
