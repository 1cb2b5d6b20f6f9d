"""Turns over HTTP: the SSE stream, 202 + detached runs, replay and resume, the turn object."""

from __future__ import annotations

import threading

import httpx
import nbformat
import pytest
from live_api import assert_error, events_of, iter_frames, run_turn
from scripted_lm import ScriptedLM, step

DONE = [step("Answer directly.", "print('hello from the sandbox')\nSUBMIT(answer='done')")]
SLOW = [
    step("Count slowly.", "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.25)"),
    step("Finish.", "SUBMIT(answer='counted')"),
]


def check_stream(frames: list, session_id: str) -> None:  # type: ignore[type-arg]
    envelopes = [f.envelope for f in frames]
    assert [e["seq"] for e in envelopes] == list(range(1, len(envelopes) + 1))
    assert [f.id for f in frames] == [str(e["seq"]) for e in envelopes]
    assert [f.event for f in frames] == [e["type"] for e in envelopes]
    assert envelopes[0]["type"] == "turn.started"
    assert envelopes[-1]["type"] in ("turn.completed", "turn.failed", "turn.cancelled")
    assert sum(e["type"] in ("turn.completed", "turn.failed", "turn.cancelled") for e in envelopes) == 1
    assert all(e["session_id"] == session_id and e["v"] == 1 for e in envelopes)


def test_turn_streams_its_events(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("say hello", DONE)
    frames = run_turn(client, session_id, "say hello")
    check_stream(frames, session_id)
    types = [f.event for f in frames]
    assert types[-1] == "turn.completed" and "lm.finished" in types and "code" in types
    assert any(f.event == "output" and "hello from the sandbox" in f.envelope["data"]["text"] for f in frames)
    turn_id = frames[0].envelope["turn_id"]
    turn = client.get(f"/api/sessions/{session_id}/turns/{turn_id}").json()
    assert turn["status"] == "completed" and turn["answer"] == "done" and turn["task"] == "say hello"
    assert turn["run_id"] == frames[0].envelope["data"]["run_id"] and turn["last_seq"] == len(frames)
    assert [t["turn_id"] for t in client.get(f"/api/sessions/{session_id}/turns").json()["turns"]] == [turn_id]
    assert client.get(f"/api/sessions/{session_id}").json()["turn_count"] == 1


def test_respond_async_then_replay(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("detached work", DONE)
    response = client.post(
        f"/api/sessions/{session_id}/turns", json={"task": "detached work"}, headers={"Prefer": "respond-async"}
    )
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["created"] is True and accepted["status"] == "running"
    turn_id, run_id = accepted["turn_id"], accepted["run_id"]
    assert response.headers["location"] == f"/api/sessions/{session_id}/turns/{turn_id}"
    url = f"/api/sessions/{session_id}/turns/{turn_id}/events"
    with client.stream("GET", url) as r:
        frames = events_of(r)
    check_stream(frames, session_id)
    assert frames[0].envelope["data"]["run_id"] == run_id
    # Resume from any point: exactly the rest, no gap, no duplicate.
    for last in (1, 3, len(frames) - 1):
        with client.stream("GET", url, headers={"Last-Event-ID": str(last)}) as r:
            rest = events_of(r)
        assert [int(f.id) for f in rest] == list(range(last + 1, len(frames) + 1))
    with client.stream("GET", url, params={"after": 2}) as r:
        assert events_of(r)[0].id == "3"
    # A client that already has the terminal event gets an empty stream that closes at once.
    with client.stream("GET", url, headers={"Last-Event-ID": str(len(frames))}, timeout=10) as r:
        assert events_of(r) == []  # a stream left open would time out the read
    assert_error(client.get(url, headers={"Last-Event-ID": "seven"}), 422)
    assert_error(client.get(url, headers={"Last-Event-ID": "-1"}), 422)
    assert_error(client.get(f"/api/sessions/{session_id}/turns/turn_missing/events"), 404)
    assert_error(client.get(f"/api/sessions/{session_id}/turns/turn_missing"), 404)
    other = client.post("/api/sessions").json()["session_id"]
    assert_error(client.get(f"/api/sessions/{other}/turns/{turn_id}"), 404)


@pytest.mark.slow
def test_disconnect_does_not_cancel_and_resume_has_no_gap(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("count slowly", SLOW)
    seen = []
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "count slowly"}) as r:
        for frame in iter_frames(r):
            if frame.event:
                seen.append(frame)
            if any(f.event == "output" for f in seen):
                break  # drop the connection mid-turn
    turn_id = seen[0].envelope["turn_id"]
    url = f"/api/sessions/{session_id}/turns/{turn_id}/events"
    with client.stream("GET", url, headers={"Last-Event-ID": seen[-1].id}) as r:
        rest = events_of(r)
    frames = seen + rest
    check_stream(frames, session_id)
    assert frames[-1].event == "turn.completed" and frames[-1].envelope["data"]["answer"] == "counted"
    assert "".join(f.envelope["data"]["text"] for f in frames if f.event == "output").count("tick") == 6


@pytest.mark.slow
def test_many_watchers_see_the_same_stream(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("watched turn", SLOW)
    accepted = client.post(
        f"/api/sessions/{session_id}/turns", json={"task": "watched turn"}, headers={"Prefer": "respond-async"}
    ).json()
    url = f"/api/sessions/{session_id}/turns/{accepted['turn_id']}/events"
    results: list[list[str]] = []

    def watch() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c, c.stream("GET", url) as r:
            results.append([f.data for f in events_of(r)])

    threads = [threading.Thread(target=watch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 8 and all(r == results[0] for r in results)
    assert '"turn.completed"' in results[0][-1]


def test_heartbeat_comments_while_idle(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("quiet turn", [{"delay": 1.2, **DONE[0]}])
    comments = 0
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "quiet turn"}) as r:
        for frame in iter_frames(r):
            comments += len(frame.comments)
    assert comments >= 2


def test_failed_turn(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("provider down", [{"status": 401, "error": "invalid api key"}])
    frames = run_turn(client, session_id, "provider down")
    check_stream(frames, session_id)
    assert frames[-1].event == "turn.failed"
    turn = client.get(f"/api/sessions/{session_id}/turns/{frames[0].envelope['turn_id']}").json()
    assert turn["status"] == "failed" and turn["error"]["message"]


def test_task_validation(client: httpx.Client, session_id: str) -> None:
    url = f"/api/sessions/{session_id}/turns"
    assert_error(client.post(url, json={}), 422, "validation_error")
    assert_error(client.post(url, json={"task": ""}), 422, "validation_error")
    assert_error(client.post(url, json={"task": "x", "mode": "fast"}), 422, "validation_error")
    assert_error(client.post(url, json={"task": "x" * 100_001}), 422, "validation_error")
    assert_error(client.post(url, json={"task": "   "}), 422, "validation_error")
    assert_error(client.post(url, json={"task": "x"}, headers={"Idempotency-Key": "k" * 201}), 422)
    assert_error(client.post("/api/sessions/ses_missing/turns", json={"task": "x"}), 404, "not_found")


def test_notebook_export(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("notebook turn", DONE)
    run_turn(client, session_id, "notebook turn")
    response = client.get(f"/api/sessions/{session_id}/notebook")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ipynb+json")
    short = session_id.partition("_")[2][:8]
    assert response.headers["content-disposition"] == f'attachment; filename="fleet-test-{short}.ipynb"'
    nb = nbformat.reads(response.text, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "fleet"
    assert [c.source for c in nb.cells if c.cell_type == "code"] == ["notebook turn"]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# test\n")
    assert_error(client.get("/api/sessions/ses_missing/notebook"), 404)


def test_an_extracted_answer_is_marked_on_the_event_and_the_turn(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("guess the total", [step("Explore.", "print('hm')"), {"answer": "about 12"}])
    body = {"task": "guess the total", "limits": {"max_iters": 1}}
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json=body) as r:
        frames = events_of(r)
    end = frames[-1].envelope
    assert end["type"] == "turn.completed" and end["data"]["answer"] == "about 12"
    assert end["data"]["extracted"] is True and end["data"]["reason"] == "max_iters"
    turn = client.get(f"/api/sessions/{session_id}/turns/{end['turn_id']}").json()
    assert turn["extracted"] is True and turn["extraction_reason"] == "max_iters"

    scripted_lm.add("submit it", DONE)
    end = run_turn(client, session_id, "submit it")[-1].envelope
    assert end["data"]["extracted"] is False and end["data"]["reason"] is None
    turn = client.get(f"/api/sessions/{session_id}/turns/{end['turn_id']}").json()
    assert turn["extracted"] is False and turn["extraction_reason"] is None
