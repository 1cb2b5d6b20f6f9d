"""The fleet-rlm profile: fleet-rlm 0.8.1's HTTP + SSE contract under /compat/fleet-rlm, over the real
server, store and sandbox with the scripted LM. Cases follow the reference's own ``tests/api/`` where they
apply (see docs/api.md, "fleet-rlm profile", for those that cannot)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from scripted_lm import ScriptedLM, step

P = "/compat/fleet-rlm"
DONE = [step("Answer directly.", "print('hello from the sandbox')\nSUBMIT(answer='done')")]
SLOW = [
    step("Count slowly.", "import time\nfor i in range(200):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"),
    step("Finish.", "SUBMIT(answer='counted')"),
]
OUTCOMES = {"turn_complete", "error", "turn_cancelled"}


def envelopes(response: httpx.Response) -> list[dict[str, Any]]:
    """The stream as the reference's client reads it: only ``data:`` lines, JSON each."""
    out = []
    for line in response.iter_lines():
        assert not line.startswith("event:"), "the reference's frames carry the type inside the JSON"
        if line.startswith("data:"):
            out.append(json.loads(line[5:].strip()))
    return out


def turn(client: httpx.Client, session_id: str, task: str, **extra: Any) -> list[dict[str, Any]]:
    with client.stream("POST", f"{P}/sessions/{session_id}/turn", json={"task": task, **extra}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return envelopes(r)


def wait_for_code(lines: Iterator[str]) -> str:
    """Read a turn's stream until its code is shown (the code then runs for 20 s); its turn_id.

    The caller keeps ``lines`` (``response.iter_lines()``) alive: a line iterator left for the garbage
    collector closes the response, the server then sees a dropped stream and cancels the turn."""
    seen = []
    for line in lines:
        if line.startswith("data:"):
            event = json.loads(line[5:])
            seen.append(event)
            if event["event"] == "repl_code":
                return str(event["turn_id"])
    raise AssertionError(f"the stream ended before any code ran: {seen}")


def check_stream(events: list[dict[str, Any]], session_id: str) -> None:
    """The reference's ordering: turn_status prelude at seq 1, one outcome, then done, seq 1, 2, 3..."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["event"] == "turn_status" and events[0]["phase"] == "preparation"
    assert events[-1]["event"] == "done" and events[-1]["payload"] == {}
    assert sum(e["event"] in OUTCOMES for e in events) == 1 and events[-2]["event"] in OUTCOMES
    for e in events:
        assert e["version"] == 1 and e["session_id"] == session_id
        assert {k: e[k] for k in e["payload"]} == e["payload"]  # the payload is spread flat as well
        assert isinstance(e["timestamp"], float)


def test_a_turn_streams_in_the_reference_envelopes(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("say hello", DONE)
    events = turn(client, "my-session-1", "say hello", idempotency_key="k1")
    check_stream(events, "my-session-1")
    by_type = {e["event"]: e for e in events}
    assert by_type["lm_end"]["reasoning"] == "Answer directly."
    assert "print('hello from the sandbox')" in by_type["repl_code"]["code"]
    assert by_type["repl_output"]["stdout"] == "hello from the sandbox\n"
    assert by_type["repl_output"]["execution_id"] == by_type["repl_code"]["execution_id"]
    assert by_type["turn_complete"]["answer"] == "done" and by_type["turn_complete"]["route"] == "rlm"
    turn_id = events[1]["turn_id"]
    status = client.get(f"{P}/sessions/my-session-1/turns/{turn_id}").json()
    assert status["status"] == "completed" and status["result"]["answer"] == "done"
    history = client.get(f"{P}/sessions/my-session-1/history").json()
    assert history["session_id"] == "my-session-1"
    assert [(t["task"], t["answer"], t["turn_id"]) for t in history["turns"]] == [("say hello", "done", turn_id)]
    listed = client.get(f"{P}/sessions").json()["sessions"]
    assert [(s["session_id"], s["turn_count"]) for s in listed if s["session_id"] == "my-session-1"] == [
        ("my-session-1", 1)
    ]  # the store may hold other tests' sessions (the PostgreSQL pass shares one database)
    # the same session in Fleet's own API, in Fleet's vocabulary: one store, two profiles
    native = client.get(f"/api/sessions/my-session-1/turns/{turn_id}").json()
    assert native["answer"] == "done" and native["task"] == "say hello"


def test_a_repeated_key_replays_the_outcome_without_a_second_run(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("once", DONE)
    first = turn(client, "s-key", "once", idempotency_key="same")
    again = turn(client, "s-key", "once", idempotency_key="same")
    assert again[-2]["event"] == "turn_complete" and again[-2]["answer"] == "done"
    assert again[-2]["turn_id"] == first[-2]["turn_id"]
    assert client.get(f"{P}/sessions").json()["sessions"][0]["turn_count"] == 1


def test_a_key_of_another_task_is_an_error_inside_the_stream(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("first task", DONE)
    turn(client, "s-conflict", "first task", idempotency_key="k")
    events = turn(client, "s-conflict", "other task", idempotency_key="k")
    check_stream(events, "s-conflict")
    assert events[-2]["event"] == "error" and "different task" in events[-2]["error"]


def test_a_dropped_stream_cancels_the_turn(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    with client.stream("POST", f"{P}/sessions/s-drop/turn", json={"task": "slow work"}) as r:
        assert r.status_code == 200
        turn_id = None
        for line in r.iter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                turn_id = turn_id or event["turn_id"] or None
                if event["event"] == "repl_code":
                    break
    assert turn_id
    deadline = time.monotonic() + 60
    status = ""
    while time.monotonic() < deadline:
        status = client.get(f"{P}/sessions/s-drop/turns/{turn_id}").json()["status"]
        if status != "running":
            break
        time.sleep(0.1)
    assert status == "cancelled"


def test_a_busy_session_is_409_before_the_stream(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    with client.stream("POST", f"{P}/sessions/s-busy/turn", json={"task": "slow work"}) as r:
        lines = r.iter_lines()
        wait_for_code(lines)
        second = client.post(f"{P}/sessions/s-busy/turn", json={"task": "more"})
        assert second.status_code == 409, second.text
        assert second.json() == {"detail": "A Turn is running on this Session; retry when it completes"}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"task": ""},
        {"task": "x", "unknown": 1},
        {"task": "x", "timeout_seconds": 5},
        {"task": "x", "timeout_seconds": "60"},
        {"task": "x", "idempotency_key": "k" * 129},
    ],
)
def test_bad_turn_bodies_are_422_with_a_detail(client: httpx.Client, body: dict[str, Any]) -> None:
    response = client.post(f"{P}/sessions/s-bad/turn", json=body)
    assert response.status_code == 422, response.text
    assert set(response.json()) == {"detail"} and response.json()["detail"]


def test_what_fleet_lacks_is_answered_not_supported(client: httpx.Client) -> None:
    for method, path, body in [
        ("POST", "/sessions/s-ns/turn", {"task": "x", "record_replay": True}),
        ("PUT", "/sessions/s-ns/mode", {"mode": "flex"}),
        ("PUT", "/sessions/s-ns/context", {"path": "files/a.csv"}),
    ]:
        response = client.request(method, P + path, json=body)
        assert response.status_code == 422, response.text
        assert "not supported" in response.json()["detail"]
    assert client.put(f"{P}/sessions/s-ns/mode", json={"mode": "rlm"}).json() == {"mode": "rlm"}
    assert client.get(f"{P}/sessions/s-ns/mode").json() == {"mode": "rlm"}
    assert client.delete(f"{P}/sessions/s-ns/context").json() == {"status": "cleared"}
    assert client.put(f"{P}/sessions/s-ns/mode", json={"mode": "turbo"}).status_code == 422


def test_attach_lists_and_config(client: httpx.Client) -> None:
    files = {"file": ("notes.txt", b"alpha\n", "text/plain")}
    attached = client.post(f"{P}/sessions/s-files/attach", files=files)
    assert attached.status_code == 200, attached.text
    assert attached.json() == {"mounted_path": "/workspace/files/notes.txt", "rel_path": "files/notes.txt"}
    listing = client.get(f"{P}/sessions/s-files/files").json()
    assert listing["session_id"] == "s-files" and "files/notes.txt" in listing["files"]
    assert client.get(f"{P}/sessions/s-files/workspace/tree").json() == listing
    config = client.get(f"{P}/sessions/s-files/config").json()
    assert config["mode"] == "rlm" and set(config["models"]) == {"root", "sub"} and config["context"] is None
    assert set(config["limits"]) == {"lm_calls", "depth", "children", "active_children", "timeout_seconds"}
    assert client.get(f"{P}/sessions/s-files/memory").json() == {"memories": []}
    assert client.get(f"{P}/skills").json()["catalog_xml"].startswith("<available_skills>")
    health = client.get(f"{P}/health").json()
    assert health["status"] == "ok" and "mlflow" in health


def test_errors_are_the_reference_detail(client: httpx.Client) -> None:
    missing = client.get(f"{P}/sessions/nope/turns/turn_x")
    assert missing.status_code == 404 and set(missing.json()) == {"detail"}
    assert client.get(f"{P}/sessions/nope/history").json() == {"session_id": "nope", "turns": []}
    assert client.delete(f"{P}/sessions/nope").status_code == 404
    for bad in ("bad id", "..bad", "x" * 65):  # reference: an invalid session id is a 422 before anything runs
        response = client.get(f"{P}/sessions/{bad}/mode")
        assert response.status_code == 422 and set(response.json()) == {"detail"}, bad


def test_fleet_api_is_unchanged_and_the_profile_stays_out_of_its_schema(client: httpx.Client) -> None:
    schema = client.get("/api/openapi.json").json()
    assert not any(path.startswith(P) for path in schema["paths"])
    missing = client.get("/api/sessions/nope")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    own = client.get(f"{P}/openapi.json").json()  # the profile's document, in the reference's paths
    assert own["servers"] == [{"url": P}]
    assert {"/sessions/{session_id}/turn", "/sessions/{session_id}/history", "/health"} <= set(own["paths"])
    assert "/openapi.json" not in own["paths"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("put", "/mode", {"mode": "rlm"}),
        ("put", "/model", {"role": "root", "model": "openai/x.y.z"}),
        ("put", "/context", {"path": "files/a.csv"}),
        ("delete", "/context", None),
        ("delete", "", None),
    ],
)
def test_session_routes_return_409_instead_of_waiting_on_a_running_turn(
    client: httpx.Client, scripted_lm: ScriptedLM, method: str, path: str, body: dict[str, Any] | None
) -> None:
    scripted_lm.add("slow work", SLOW)
    session = f"s-locked-{method}{path.replace('/', '-')}"  # one per case: a case's turn may still be ending
    with client.stream("POST", f"{P}/sessions/{session}/turn", json={"task": "slow work"}) as r:
        lines = r.iter_lines()
        wait_for_code(lines)
        response = client.request(method.upper(), f"{P}/sessions/{session}{path}", json=body)
        assert response.status_code == 409, response.text
        assert "Turn" in response.json()["detail"]


def test_a_disconnect_releases_the_session_for_the_next_turn(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    scripted_lm.add("next one", DONE)
    with client.stream("POST", f"{P}/sessions/s-release/turn", json={"task": "slow work"}) as r:
        wait_for_code(r.iter_lines())  # the stream drops here
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = client.post(f"{P}/sessions/s-release/turn", json={"task": "next one"})
        if response.status_code != 409:
            break
        time.sleep(0.1)
    assert response.status_code == 200, response.text
    assert '"turn_complete"' in response.text


@pytest.mark.slow
def test_a_deadline_ends_the_stream_with_an_error_and_is_stored_as_cancelled(
    client: httpx.Client, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("slow work", SLOW)
    events = turn(client, "s-deadline", "slow work", timeout_seconds=10)
    check_stream(events, "s-deadline")
    assert events[-2]["event"] == "error" and events[-2]["outcome"] == "timeout"
    status = client.get(f"{P}/sessions/s-deadline/turns/{events[1]['turn_id']}").json()
    assert status["status"] == "cancelled" and status["result"]["error"]


def test_a_bare_null_turn_body_is_a_422_and_never_runs_a_turn(client: httpx.Client) -> None:
    response = client.post(f"{P}/sessions/s-null/turn", content=b"null", headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert client.get(f"{P}/sessions/s-null/history").json()["turns"] == []


def test_explicit_nulls_are_accepted_on_optional_turn_fields_and_rejected_on_record_replay(
    client: httpx.Client, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("nulls", DONE)
    events = turn(client, "s-nulls", "nulls", idempotency_key=None, timeout_seconds=None)
    assert events[-2]["event"] == "turn_complete"
    response = client.post(f"{P}/sessions/s-nulls/turn", json={"task": "nulls", "record_replay": None})
    assert response.status_code == 422


def test_memory_routes_save_list_delete_and_refuse_invalid_input(client: httpx.Client) -> None:
    saved = client.put(f"{P}/sessions/s-mem/memory/m1", json={"content": "likes tea", "kind": "preference"})
    assert saved.status_code == 200 and saved.json() == {"memory_id": "m1"}
    listed = client.get(f"{P}/sessions/s-mem/memory", params={"q": "tea"}).json()["memories"]
    assert [(m["memory_id"], m["content"], m["kind"]) for m in listed] == [("m1", "likes tea", "preference")]
    assert client.put(f"{P}/sessions/s-mem/memory/m2", json={"content": "x", "kind": "rumour"}).status_code == 422
    assert client.put(f"{P}/sessions/s-mem/memory/m2", json={"content": ""}).status_code == 422
    assert client.delete(f"{P}/sessions/s-mem/memory/m1").json() == {"deleted": "m1"}
    assert client.delete(f"{P}/sessions/s-mem/memory/m1").status_code == 404
    assert client.get(f"{P}/sessions/s-mem/memory").json() == {"memories": []}


def test_attach_treats_an_empty_browser_file_input_as_missing(client: httpx.Client) -> None:
    response = client.post(f"{P}/sessions/s-att/attach", files={"file": ("", b"", "application/octet-stream")})
    assert response.status_code == 422, response.text
    assert set(response.json()) == {"detail"}


def test_attach_accepts_a_named_zero_byte_file(client: httpx.Client) -> None:
    response = client.post(f"{P}/sessions/s-att/attach", files={"file": ("empty.txt", b"", "text/plain")})
    assert response.status_code == 200, response.text
    assert response.json()["rel_path"] == "files/empty.txt"


def test_concurrent_first_calls_create_the_session_once(client: httpx.Client, live: Any) -> None:
    def first_call(results: list[int]) -> None:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            results.append(c.get(f"{P}/sessions/s-race/mode").status_code)

    results: list[int] = []
    threads = [threading.Thread(target=first_call, args=(results,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [200] * 6
    listed = [s["session_id"] for s in client.get(f"{P}/sessions").json()["sessions"]]
    assert listed.count("s-race") == 1  # the store may hold other tests' sessions (PostgreSQL's pass)
    assert client.get("/api/sessions/s-race").status_code == 200  # a session of Fleet's own API too


def test_workspace_stat_read_write_and_delete(client: httpx.Client) -> None:
    """0.8.1's ``/workspace/stat|files/{rel_path}`` over Fleet's workspace files (the reference's
    test_routes cases for stat, download, a missing file and the one-content-field rule)."""
    client.post(f"{P}/sessions/s-ws/attach", files={"file": ("notes.txt", b"alpha\n", "text/plain")})
    stat = client.get(f"{P}/sessions/s-ws/workspace/stat/files/notes.txt")
    assert stat.status_code == 200, stat.text
    assert stat.json() == {"path": "files/notes.txt", "size_bytes": 6, "sha256": hashlib.sha256(b"alpha\n").hexdigest()}
    download = client.get(f"{P}/sessions/s-ws/workspace/files/files/notes.txt")
    assert download.status_code == 200 and download.content == b"alpha\n"

    written = client.put(f"{P}/sessions/s-ws/workspace/files/files/out.txt", json={"content": "héllo"})
    assert written.status_code == 200, written.text
    assert written.json() == {
        "path": "files/out.txt",
        "size_bytes": len("héllo".encode()),
        "sha256": hashlib.sha256("héllo".encode()).hexdigest(),
        "mounted_path": "/workspace/files/out.txt",
    }
    raw = client.put(f"{P}/sessions/s-ws/workspace/files/files/b.bin", json={"content_base64": "AAEC"})
    assert raw.json()["size_bytes"] == 3
    assert client.get(f"{P}/sessions/s-ws/workspace/files/files/b.bin").content == b"\x00\x01\x02"
    for body in ({"content": "x", "content_base64": "eA=="}, {}, {"content_base64": "not base64!"}, {"x": 1}):
        response = client.put(f"{P}/sessions/s-ws/workspace/files/files/a.txt", json=body)
        assert response.status_code == 422 and set(response.json()) == {"detail"}, (body, response.text)

    assert client.delete(f"{P}/sessions/s-ws/workspace/files/files/out.txt").json() == {"deleted": "files/out.txt"}
    for path in ("files/out.txt", "files/missing.bin", "%2e%2e/etc/passwd"):
        for route in ("stat", "files"):
            missing = client.get(f"{P}/sessions/s-ws/workspace/{route}/{path}")
            assert missing.status_code == 404 and set(missing.json()) == {"detail"}, (route, path)
    assert client.delete(f"{P}/sessions/s-ws/workspace/files/files/out.txt").status_code == 404
    # the same files in Fleet's own API
    assert client.get("/api/sessions/s-ws/workspace/stat/files/b.bin").json()["size"] == 3


@pytest.mark.slow
def test_workspace_writes_are_409_while_a_turn_runs(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    with client.stream("POST", f"{P}/sessions/s-wsbusy/turn", json={"task": "slow work"}) as r:
        lines = r.iter_lines()
        wait_for_code(lines)
        put = client.put(f"{P}/sessions/s-wsbusy/workspace/files/files/a.txt", json={"content": "x"})
        assert put.status_code == 409 and "Turn" in put.json()["detail"]
        assert client.delete(f"{P}/sessions/s-wsbusy/workspace/files/files/a.txt").status_code == 409


def test_skill_pull_and_push_are_not_supported(client: httpx.Client) -> None:
    for path in ("/skills/pull", "/skills/push"):
        response = client.post(P + path, params={"session_id": "s-skills"})
        assert response.status_code == 422 and "not supported" in response.json()["detail"], response.text
