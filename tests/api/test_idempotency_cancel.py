"""Idempotency-Key, the one-running-turn rule (409) and durable cancellation, within one API process."""

from __future__ import annotations

import threading
import time

import httpx
from live_api import assert_error, events_of, frames_until, iter_frames, run_turn
from scripted_lm import ScriptedLM, step

DONE = [step("Answer.", "SUBMIT(answer='once')")]
FOREVER = [step("Wait.", "import time\nwhile True:\n    time.sleep(0.05)")]


def start_async(client: httpx.Client, session_id: str, task: str, key: str | None = None) -> httpx.Response:
    headers = {"Prefer": "respond-async", **({"Idempotency-Key": key} if key else {})}
    return client.post(f"/api/sessions/{session_id}/turns", json={"task": task}, headers=headers)


def test_repeated_key_returns_the_same_turn(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("idempotent task", DONE)
    first = run_turn(client, session_id, "idempotent task", **{"Idempotency-Key": "key-1"})
    again = run_turn(client, session_id, "idempotent task", **{"Idempotency-Key": "key-1"})
    assert [f.data for f in again] == [f.data for f in first]  # the stored events, not a second run
    accepted = start_async(client, session_id, "idempotent task", "key-1").json()
    assert accepted["created"] is False and accepted["turn_id"] == first[0].envelope["turn_id"]
    assert client.get(f"/api/sessions/{session_id}").json()["turn_count"] == 1
    error = assert_error(start_async(client, session_id, "another task", "key-1"), 422, "validation_error")
    assert "Idempotency-Key" in error["message"]


def test_concurrent_requests_with_one_key_run_once(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("raced task", [{"delay": 0.5, **DONE[0]}])
    barrier = threading.Barrier(8)
    answers: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            barrier.wait()
            answers.append(start_async(c, session_id, "raced task", "same-moment"))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in answers] == [202] * 8, [r.text for r in answers]
    assert len({r.json()["turn_id"] for r in answers}) == 1
    assert sum(r.json()["created"] for r in answers) == 1
    turn_id = answers[0].json()["turn_id"]
    with client.stream("GET", f"/api/sessions/{session_id}/turns/{turn_id}/events") as r:
        frames = events_of(r)
    assert [f.event for f in frames].count("turn.started") == 1 and frames[-1].event == "turn.completed"
    assert client.get(f"/api/sessions/{session_id}").json()["turn_count"] == 1


def test_busy_session_is_409_and_cancel_is_durable(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("runs until cancelled", FOREVER)
    running = start_async(client, session_id, "runs until cancelled").json()
    url = f"/api/sessions/{session_id}/turns/{running['turn_id']}/events"
    with client.stream("GET", url) as r:  # wait until its code runs
        frames_until(r, "code")
    error = assert_error(start_async(client, session_id, "second task"), 409, "session_busy")
    assert error["turn_id"] == running["turn_id"]
    assert_error(client.delete(f"/api/sessions/{session_id}"), 409, "session_busy")

    asked = time.monotonic()
    cancel = client.put(f"/api/runs/{running['run_id']}/cancellation")
    assert cancel.status_code == 202
    assert cancel.json() == {"run_id": running["run_id"], "state": "requested", "turn_id": running["turn_id"]}
    assert client.put(f"/api/runs/{running['run_id']}/cancellation").json()["state"] in (
        "already_requested",
        "already_terminal",
    )
    with client.stream("GET", url) as r:
        frames = events_of(r)
    assert frames[-1].event == "turn.cancelled" and time.monotonic() - asked < 30  # liveness: the code never ends
    turn = client.get(f"/api/sessions/{session_id}/turns/{running['turn_id']}").json()
    assert turn["status"] == "cancelled" and turn["cancel_requested"] is True
    assert client.put(f"/api/runs/{running['run_id']}/cancellation").json()["state"] == "already_terminal"
    assert_error(client.put("/api/runs/run_unknown/cancellation"), 404, "run_not_found")
    assert_error(client.put("/api/runs/not a run/cancellation"), 404, "run_not_found")
    # The session is free again.
    scripted_lm.add("after the cancel", DONE)
    assert run_turn(client, session_id, "after the cancel")[-1].event == "turn.completed"


def test_repeated_key_on_a_running_turn_gets_its_live_tail(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("long running keyed", FOREVER)
    first = start_async(client, session_id, "long running keyed", "live-key").json()
    url = f"/api/sessions/{session_id}/turns"
    headers = {"Idempotency-Key": "live-key"}
    with client.stream("POST", url, json={"task": "long running keyed"}, headers=headers) as r:
        assert r.headers["fleet-turn-id"] == first["turn_id"]
        stream = iter_frames(r)
        seen = []
        for frame in stream:
            seen += [frame] if frame.event else []
            if frame.event == "code":
                break
        assert seen[0].envelope["turn_id"] == first["turn_id"] and seen[0].id == "1"
        assert client.put(f"/api/runs/{first['run_id']}/cancellation").json()["state"] == "requested"
        rest = [frame for frame in stream if frame.event]
    frames = seen + rest
    assert frames[-1].event == "turn.cancelled"
    assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1))
    assert client.get(f"/api/sessions/{session_id}").json()["turn_count"] == 1
