"""Feedback on answers over HTTP: mark a turn good or bad with a note, read it back (also after a restart),
and add a turn marked good to a data set, or serve the turns marked good as one; over the real server and
store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from live_api import LiveServer, assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings
from fleet_kernel.evals import load_dataset
from fleet_kernel.evals.feedback import add_to_dataset
from fleet_kernel.store import Store


def test_mark_a_turn_and_read_it_back_after_a_restart(settings: Settings, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("what is 6*7", [step("Compute.", "SUBMIT(answer=str(6*7))")])
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        frames = run_turn(client, sid, "what is 6*7")
        tid = frames[-1].envelope["turn_id"]
        url = f"/api/sessions/{sid}/turns/{tid}/feedback"
        assert_error(client.get(url), 404, "not_found")
        first = client.post(url, json={"rating": "bad", "note": "too terse"})
        assert first.status_code == 200, first.text
        assert first.json()["rating"] == "bad" and first.json()["note"] == "too terse"
        again = client.post(url, json={"rating": "good"})
        assert (again.json()["rating"], again.json()["note"]) == ("good", "")
        assert again.json()["created_at"] == first.json()["created_at"]
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        kept = client.get(url)
        assert kept.status_code == 200 and kept.json()["rating"] == "good"


def test_bad_feedback_is_refused_with_the_contract_error(client: httpx.Client, session_id: str, scripted_lm) -> None:
    scripted_lm.add("say hi", [step("Hi.", "SUBMIT(answer='hi')")])
    tid = run_turn(client, session_id, "say hi")[-1].envelope["turn_id"]
    url = f"/api/sessions/{session_id}/turns/{tid}/feedback"
    assert_error(client.post(url, json={"rating": "meh"}), 422)
    assert_error(client.post(url, json={"rating": "good", "extra": 1}), 422)
    assert_error(client.post(url, json={"rating": "good", "note": "x" * 4001}), 422)
    assert_error(client.post(f"/api/sessions/{session_id}/turns/turn_nope/feedback", json={"rating": "good"}), 404)
    other = client.post("/api/sessions", json={}).json()["session_id"]
    assert_error(client.post(f"/api/sessions/{other}/turns/{tid}/feedback", json={"rating": "good"}), 404)
    assert_error(client.get(url), 404)  # nothing was kept by the refused requests


def test_a_turn_marked_good_joins_a_data_set(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, settings: Settings, tmp_path: Path
) -> None:
    scripted_lm.add("capital of Peru", [step("Lima.", "SUBMIT(answer='Lima')")])
    scripted_lm.add("capital of Chad", [step("Guess.", "SUBMIT(answer='Paris')")])
    good = run_turn(client, session_id, "capital of Peru")[-1].envelope["turn_id"]
    bad = run_turn(client, session_id, "capital of Chad")[-1].envelope["turn_id"]
    client.post(f"/api/sessions/{session_id}/turns/{good}/feedback", json={"rating": "good"})
    client.post(f"/api/sessions/{session_id}/turns/{bad}/feedback", json={"rating": "bad", "note": "it is N'Djamena"})
    dataset = tmp_path / "marked.jsonl"

    async def add() -> str:
        store = await Store.open(settings.database_url)
        try:
            await add_to_dataset(store, session_id, good, dataset)
            try:
                await add_to_dataset(store, session_id, bad, dataset)
            except Exception as exc:  # noqa: BLE001 - the message is what the test reads
                return str(getattr(exc, "message", exc))
            return ""
        finally:
            await store.close()

    refusal = asyncio.run(add())
    assert "marked bad" in refusal
    (task,) = load_dataset(dataset)
    assert (task.task, task.expected, task.scorer) == ("capital of Peru", "Lima", "exact")
    assert json.loads(dataset.read_text())["id"] == good

    # over HTTP: the turns marked good as data set rows, which POST /api/evals runs as they are
    served = client.get("/api/feedback/dataset", params={"session_id": session_id})
    assert served.status_code == 200, served.text
    assert served.json()["tasks"] == [json.loads(dataset.read_text())]
    everything = client.get("/api/feedback/dataset").json()["tasks"]  # every session's (a shared store has more)
    assert all(task in everything for task in served.json()["tasks"])
    scripted_lm.add("capital of Peru", [step("Lima.", "SUBMIT(answer='Lima')")])
    report = client.post("/api/evals", json=served.json(), timeout=120)
    assert report.status_code == 200, report.text
    assert [(r["task_id"], r["score"]) for r in report.json()["results"]] == [(good, 1.0)]
    # the latest marks first when a limit cuts; a run's session (unmarked) adds nothing
    client.post(f"/api/sessions/{session_id}/turns/{bad}/feedback", json={"rating": "good"})
    (latest,) = client.get("/api/feedback/dataset", params={"limit": 1}).json()["tasks"]
    assert (latest["id"], latest["expected"]) == (bad, "Paris")
    assert len(client.get("/api/feedback/dataset", params={"session_id": session_id}).json()["tasks"]) == 2
    assert_error(client.get("/api/feedback/dataset", params={"limit": 0}), 422)
    assert_error(client.get("/api/feedback/dataset", params={"session_id": "sess_nope"}), 404)
