"""Memories end to end: kept by the model's code in one turn, found by search in the next (also after a
server restart), managed over HTTP, mirrored to memory/MEMORIES.md; over the real sandbox and server."""

from __future__ import annotations

import httpx
from live_api import LiveServer, assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings

REMEMBER = [
    step("Keep it.", "mid = remember(\"The user's cat is called Miso\", kind='fact')\nprint('kept', mid)"),
    step("Done.", "SUBMIT(answer='noted')"),
]
RECALL = [
    step("Look it up.", "hits = search_memories('what is the cat called', limit=3)\nprint(hits)"),
    step("Answer.", "SUBMIT(answer=hits[0]['content'] + ' | ' + hits[0]['kind'])"),
]


def _tool_names(frames: list) -> list[str]:  # type: ignore[type-arg]
    return [f.envelope["data"]["name"] for f in frames if f.event == "tool.started"]


def test_memories_outlive_the_turn_and_the_server(settings: Settings, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("remember my cat", REMEMBER)
    scripted_lm.add("what is my cat called", RECALL)
    scripted_lm.add("recall after restart", RECALL)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={"title": "pets"}).json()["session_id"]
        first = run_turn(client, sid, "remember my cat")
        assert first[-1].event == "turn.completed", first[-1].envelope["data"]
        assert "remember" in _tool_names(first)
        finished = [f.envelope["data"] for f in first if f.event == "tool.finished"]
        assert finished and all(d["ok"] for d in finished)

        second = run_turn(client, sid, "what is my cat called")
        assert second[-1].envelope["data"]["answer"] == "The user's cat is called Miso | fact"
        assert "search_memories" in _tool_names(second)

    mirror = settings.workspaces_dir / sid / "memory" / "MEMORIES.md"
    assert "The user's cat is called Miso" in mirror.read_text()

    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        third = run_turn(client, sid, "recall after restart")
        assert third[-1].envelope["data"]["answer"] == "The user's cat is called Miso | fact"
        listed = client.get(f"/api/sessions/{sid}/memory", params={"q": "cat"}).json()["memories"]
        assert [m["content"] for m in listed] == ["The user's cat is called Miso"]
        assert set(listed[0]) == {"memory_id", "content", "kind", "created_at", "updated_at"}


def test_each_session_s_tools_keep_to_that_session(settings: Settings, scripted_lm: ScriptedLM) -> None:
    # one server, two sessions in turn: the second turn's remember() must write to its own session
    scripted_lm.add("remember my cat", REMEMBER)
    scripted_lm.add("remember my dog", [
        step("Keep it.", "mid = remember('The dog is called Rex', kind='fact')\nprint('kept', mid)"),
        step("Done.", "SUBMIT(answer='noted')"),
    ])  # fmt: skip
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        cat, dog = (client.post("/api/sessions", json={"title": t}).json()["session_id"] for t in ("cat", "dog"))
        assert run_turn(client, cat, "remember my cat")[-1].event == "turn.completed"
        assert run_turn(client, dog, "remember my dog")[-1].event == "turn.completed"
        kept = {sid: [m["content"] for m in client.get(f"/api/sessions/{sid}/memory").json()["memories"]]
                for sid in (cat, dog)}  # fmt: skip
    assert kept == {cat: ["The user's cat is called Miso"], dog: ["The dog is called Rex"]}


def test_memories_over_http(client: httpx.Client, session_id: str, settings: Settings, scripted_lm: ScriptedLM) -> None:
    base = f"/api/sessions/{session_id}/memory"
    put = client.put(f"{base}/style", json={"content": "Answer in French", "kind": "preference"})
    assert put.status_code == 200, put.text
    assert put.json()["memory_id"] == "style" and put.json()["kind"] == "preference"
    client.put(f"{base}/style", json={"content": "Answer in German", "kind": "preference"})
    client.put(f"{base}/unit", json={"content": "Use metric units"})
    assert [m["content"] for m in client.get(base).json()["memories"]] == ["Answer in German", "Use metric units"]
    assert [m["memory_id"] for m in client.get(base, params={"q": "german"}).json()["memories"]] == ["style"]
    assert client.get(base, params={"q": "french"}).json()["memories"] == []
    mirror = settings.workspaces_dir / session_id / "memory" / "MEMORIES.md"
    assert "Answer in German" in mirror.read_text() and "French" not in mirror.read_text()

    # The model finds and forgets what the API wrote.
    scripted_lm.add("forget the units", [
        step("Find and forget.", "hit = search_memories('metric')[0]\nprint(forget(hit['memory_id']), forget('nope'))"),
        step("Done.", "SUBMIT(answer='forgotten')"),
    ])  # fmt: skip
    frames = run_turn(client, session_id, "forget the units")
    assert any(f.event == "output" and "True False" in f.envelope["data"]["text"] for f in frames)
    assert [m["memory_id"] for m in client.get(base).json()["memories"]] == ["style"]
    assert "metric" not in mirror.read_text()

    assert client.delete(f"{base}/style").status_code == 204
    assert_error(client.delete(f"{base}/style"), 404, "not_found")
    assert client.get(base).json()["memories"] == []
    assert_error(client.put(f"{base}/x", json={"content": ""}), 422, "validation_error")
    assert_error(client.put(f"{base}/x", json={"content": "y" * 5000}), 422, "validation_error")
    assert_error(client.put(f"{base}/x", json={"content": "ok", "kind": "Bad Kind"}), 422, "validation_error")
    assert_error(client.get("/api/sessions/ses_missing/memory"), 404, "not_found")


def test_a_tool_error_reaches_the_model(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("remember too much", [
        step("Try.", "try:\n    remember('x' * 10000)\nexcept Exception as exc:\n    print('refused:', exc)"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    frames = run_turn(client, session_id, "remember too much")
    assert any(f.event == "output" and "memory.max_chars" in f.envelope["data"]["text"] for f in frames)
    assert [f.envelope["data"]["ok"] for f in frames if f.event == "tool.finished"] == [False]
