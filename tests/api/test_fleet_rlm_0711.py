"""The fleet-rlm profile, version 0.7.11: the reference's contract under /compat/fleet-rlm/api, over the real
server, store and sandbox with the scripted LM.

fleet-rlm 0.7.11's sdist ships no tests; the cases follow its routes (``fleet_rlm/api/routes``), its error
contract (``api/errors.py``) and its stream (``routes/turns.py``, ``api/sse.py``), and port the cases of the
0.8.1 suite that apply to both versions. docs/api.md ("fleet-rlm profile") lists what cannot apply.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_api import LiveServer
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings

P = "/compat/fleet-rlm"
A = f"{P}/api"
DONE = [step("Answer directly.", "print('hello from the sandbox')\nSUBMIT(answer='done')")]
SLOW = [
    step("Count slowly.", "import time\nfor i in range(200):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"),
    step("Finish.", "SUBMIT(answer='counted')"),
]
OUTCOMES = {"turn_finish", "turn_cancelled"}


def read_chunks(lines: Iterator[str], until: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """The stream as 0.7.11's client reads it: ``event:`` names the chunk, ``data:`` is its JSON (the
    type again), and a last ``data: [DONE]``. Stops after a chunk of type ``until`` when given."""
    out: list[dict[str, Any]] = []
    name = None
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                assert name is None, "[DONE] is a bare data line"
                return out, True
            chunk = json.loads(data)
            assert chunk["type"] == name, (name, chunk)
            out.append(chunk)
            name = None
            if chunk["type"] == until:
                return out, False
    return out, False


def new_session(client: httpx.Client, title: str | None = None) -> str:
    response = client.post(f"{A}/sessions", json={"title": title} if title else {})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def turn(client: httpx.Client, session_id: str, text: str, key: str, **extra: Any) -> list[dict[str, Any]]:
    headers = {"Idempotency-Key": key}
    with client.stream("POST", f"{A}/sessions/{session_id}/turns", json={"text": text, **extra}, headers=headers) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        chunks, done = read_chunks(r.iter_lines())
    assert done, f"the stream ended without [DONE]: {chunks}"
    return chunks


def check_stream(chunks: list[dict[str, Any]]) -> None:
    """The prelude first, exactly one outcome, nothing after it."""
    assert chunks[0] == {"type": "turn_status", "phase": "preparation", "status": "running", "message": None}
    outcomes = [i for i, c in enumerate(chunks) if c["type"] in OUTCOMES]
    assert len(outcomes) == 1 and outcomes[0] == len(chunks) - 1, [c["type"] for c in chunks]


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message"} and body["code"] == code and body["message"], body
    return dict(body)


def test_a_turn_streams_named_chunks_and_commits_its_history(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("say hello", DONE)
    sid = new_session(client, "Greetings")
    chunks = turn(client, sid, "say hello", "k1")
    check_stream(chunks)
    by_type = {c["type"]: c for c in chunks}
    start = by_type["turn_start"]
    assert start["sessionId"] == sid and start["delivery"] == "live" and start["runId"]
    assert by_type["reasoning"]["text"] == "Answer directly."
    assert "print('hello from the sandbox')" in by_type["code"]["code"]
    assert "".join(c["output"] for c in chunks if c["type"] == "output") == "hello from the sandbox\n"
    finals = [c for c in chunks if c["type"] == "text" and c["final"]]
    assert [c["text"] for c in finals] == ["done"]
    finish = by_type["turn_finish"]
    assert finish["finishReason"] == "stop" and finish["status"] == "completed" and finish["traceId"]

    detail = client.get(f"{A}/sessions/{sid}").json()
    assert detail["id"] == sid and detail["title"] == "Greetings" and detail["status"] == "active"
    assert detail["checkpoint_version"] == 1
    page = client.get(f"{A}/sessions/{sid}/turns").json()
    assert page["next_after_sequence"] is None
    user, assistant = page["items"]
    assert user["role"] == "user" and user["parts"][0] == {"type": "text", "text": "say hello", "state": "done"}
    assert assistant["role"] == "assistant" and assistant["id"] == start["runId"]
    kinds = [p["type"] for p in assistant["parts"]]
    assert {"reasoning", "data-rlm-code", "data-rlm-output", "text"} <= set(kinds)
    assert assistant["parts"][kinds.index("text")]["text"] == "done"
    assert [m["metadata"]["sequence"] for m in page["items"]] == [1, 2]
    assert client.get(f"{A}/sessions/{sid}/turns", params={"after_sequence": 1}).json()["items"] == [assistant]
    # one store, two vocabularies: the same turn in Fleet's own API
    native = client.get(f"/api/sessions/{sid}/turns").json()["turns"]
    assert [(t["task"], t["answer"], t["run_id"]) for t in native] == [("say hello", "done", start["runId"])]


def test_idempotency_key_is_required_and_bodies_are_validated(client: httpx.Client) -> None:
    sid = new_session(client)
    assert_error(client.post(f"{A}/sessions/{sid}/turns", json={"text": "hi"}), 422, "invalid_request")
    key = {"Idempotency-Key": "k"}
    for body in [
        {},
        {"text": ""},
        {"text": "   "},
        {"text": "x", "task": "x"},
        {"text": "x", "attachment_ids": ["a", "a"]},
    ]:
        assert_error(client.post(f"{A}/sessions/{sid}/turns", json=body, headers=key), 422, "invalid_request")
    bad_skill = {"text": "x", "skill_selections": [{"id": "not-a-uuid", "expected_version": "1"}]}
    response = client.post(f"{A}/sessions/{sid}/turns", json=bad_skill, headers=key)
    assert_error(response, 422, "invalid_skill_selection")
    assert client.get(f"{A}/sessions/{sid}/turns").json()["items"] == []


def test_a_turn_that_cannot_open_is_an_error_inside_the_200_stream(
    client: httpx.Client, scripted_lm: ScriptedLM
) -> None:
    def opened(session_id: str, text: str, key: str, **extra: Any) -> list[dict[str, Any]]:
        chunks = turn(client, session_id, text, key, **extra)
        assert chunks[0]["phase"] == "preparation"
        assert chunks[1:] == [
            {"type": "turn_error", "message": chunks[1]["message"], "code": "open_failed"},
            {"type": "turn_finish", "finishReason": "error", "status": "error"},
        ]
        return chunks

    assert opened("0b8a3f4e-0000-4000-8000-000000000000", "hi", "k")[1]["message"] == "Session not found"
    sid = new_session(client)
    scripted_lm.add("first task", DONE)
    check_stream(turn(client, sid, "first task", "same"))
    assert opened(sid, "another task", "same")[1]["message"] == "Idempotency key input mismatch"
    unknown_skill = [{"id": "0b8a3f4e-0000-4000-8000-000000000000", "expected_version": "1"}]
    assert opened(sid, "x", "k2", skill_selections=unknown_skill)[1]["message"] == "Invalid Skill selection"
    assert opened(sid, "x", "k3", attachment_ids=["att_missing"])[1]["message"] == "Invalid request"


def test_a_repeated_key_replays_the_same_run(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("once", DONE)
    sid = new_session(client)
    first = turn(client, sid, "once", "same")
    again = turn(client, sid, "once", "same")
    check_stream(again)
    starts = [c for c in first + again if c["type"] == "turn_start"]
    assert [s["delivery"] for s in starts] == ["live", "replay"] and starts[0]["runId"] == starts[1]["runId"]
    assert client.get(f"{A}/sessions/{sid}").json()["checkpoint_version"] == 1


def test_a_busy_session_is_an_error_inside_the_stream(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    sid = new_session(client)
    with client.stream(
        "POST", f"{A}/sessions/{sid}/turns", json={"text": "slow work"}, headers={"Idempotency-Key": "a"}
    ) as r:
        lines = r.iter_lines()  # kept alive: a collected iterator closes the stream, which cancels the turn
        read_chunks(lines, until="code")
        second = turn(client, sid, "more", "b")
        assert second[1] == {"type": "turn_error", "message": "A Turn is already running", "code": "open_failed"}


def test_a_dropped_stream_cancels_the_turn_and_sends_no_done(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    sid = new_session(client)
    with client.stream(
        "POST", f"{A}/sessions/{sid}/turns", json={"text": "slow work"}, headers={"Idempotency-Key": "a"}
    ) as r:
        chunks, done = read_chunks(r.iter_lines(), until="code")
    assert not done
    run_id = chunks[1]["runId"]
    deadline = time.monotonic() + 60
    status = ""
    while time.monotonic() < deadline:
        turns = client.get(f"/api/sessions/{sid}/turns").json()["turns"]
        status = next(t["status"] for t in turns if t["run_id"] == run_id)
        if status != "running":
            break
        time.sleep(0.1)
    assert status == "cancelled"


def test_cancellation_ends_the_stream_with_turn_cancelled(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("slow work", SLOW)
    sid = new_session(client)
    with client.stream(
        "POST", f"{A}/sessions/{sid}/turns", json={"text": "slow work"}, headers={"Idempotency-Key": "a"}
    ) as r:
        lines = r.iter_lines()
        chunks, _ = read_chunks(lines, until="code")
        run_id = chunks[1]["runId"]
        cancelled = client.put(f"{A}/runs/{run_id}/cancellation")
        assert cancelled.status_code == 200 and cancelled.json() == {"run_id": run_id, "state": "requested"}
        rest, done = read_chunks(lines)
    assert done and rest[-1]["type"] == "turn_cancelled" and rest[-1]["reason"]
    check_stream(chunks + rest)
    assert client.put(f"{A}/runs/{run_id}/cancellation").json()["state"] == "already_terminal"
    assert_error(client.put(f"{A}/runs/run_missing/cancellation"), 404, "run_not_found")


def test_sessions_list_patch_and_errors(client: httpx.Client) -> None:
    tag = uuid.uuid4().hex[:8]  # the store may hold other tests' sessions (the PostgreSQL pass shares one database)
    ids = [new_session(client, f"alpha {tag} {n}") for n in range(3)]
    other = new_session(client, f"beta {tag}")
    page = client.get(f"{A}/sessions", params={"search": f"ALPHA {tag}", "limit": 2}).json()
    assert page["total"] == 3 and page["limit"] == 2 and page["offset"] == 0 and page["has_more"] is True
    assert len(page["items"]) == 2 and set(page["items"][0]) == {
        "id", "title", "status", "checkpoint_version", "created_at", "updated_at"
    }  # fmt: skip
    rest = client.get(f"{A}/sessions", params={"search": f"alpha {tag}", "limit": 2, "offset": 2}).json()
    assert rest["has_more"] is False and {i["id"] for i in page["items"] + rest["items"]} == set(ids)

    archived = client.patch(f"{A}/sessions/{other}", json={"status": "archived", "title": f"gamma {tag}"})
    assert archived.status_code == 200, archived.text
    assert archived.json()["status"] == "archived" and archived.json()["title"] == f"gamma {tag}"
    listed = client.get(f"{A}/sessions", params={"status": "archived", "limit": 100}).json()["items"]
    assert other in [s["id"] for s in listed] and {s["status"] for s in listed} == {"archived"}
    active = client.get(f"{A}/sessions", params={"status": "active", "search": tag}).json()["items"]
    assert {s["id"] for s in active} == set(ids)
    assert_error(client.patch(f"{A}/sessions/{other}", json={}), 422, "session_no_fields")
    assert_error(client.patch(f"{A}/sessions/{other}", json={"title": "  "}), 422, "session_title_empty")
    assert_error(client.patch(f"{A}/sessions/{other}", json={"status": "gone"}), 422, "invalid_request")
    assert_error(client.get(f"{A}/sessions/nope"), 404, "session_not_found")
    assert_error(client.get(f"{A}/sessions/bad id"), 404, "session_not_found")
    assert_error(client.get(f"{A}/sessions/nope/turns"), 404, "session_not_found")
    assert_error(client.get(f"{A}/sessions/{other}/task"), 404, "task_not_found")
    assert_error(client.post(f"{A}/sessions", json={"title": "x", "extra": 1}), 422, "invalid_request")
    assert_error(client.get(f"{A}/sessions", params={"limit": 101}), 422, "invalid_request")


CODE = """
print(open('/workspace/files/notes.txt').read())
with open('/workspace/artifacts/summary.md', 'w') as f:
    f.write('# total\\n10\\n')
"""


def test_an_upload_is_attached_by_a_turn_and_its_artifact_served(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("read the notes", [step("Read it.", CODE), step("Done.", "SUBMIT(answer='read')")])
    uploaded = client.post(f"{A}/attachments", files={"attachment": ("notes.txt", b"alpha beta\n", "text/plain")})
    assert uploaded.status_code == 201, uploaded.text
    att = uploaded.json()
    assert set(att) == {"id", "filename", "content_type", "byte_size", "checksum_sha256"}
    assert (att["filename"], att["content_type"], att["byte_size"]) == ("notes.txt", "text/plain", 11)
    assert client.get(f"{A}/attachments/{att['id']}").json() == att
    assert_error(client.get(f"{A}/attachments/att_missing"), 404, "attachment_not_found")

    sid = new_session(client)
    chunks = turn(client, sid, "read the notes", "k", attachment_ids=[att["id"]])
    check_stream(chunks)
    assert "alpha beta" in "".join(c["output"] for c in chunks if c["type"] == "output")
    (artifact,) = [c for c in chunks if c["type"] == "artifact"]
    assert artifact["title"] == "artifacts/summary.md" and artifact["artifactKind"] == "markdown"
    meta = client.get(f"{A}/artifacts/{artifact['artifactId']}").json()
    assert meta["run_id"] == chunks[1]["runId"] and meta["session_id"] == sid and meta["kind"] == "markdown"
    assert meta["byte_size"] == len(b"# total\n10\n") and meta["checksum_sha256"] == artifact["checksumSha256"]
    content = client.get(f"{A}/artifacts/{artifact['artifactId']}/content")
    assert content.status_code == 200 and content.content == b"# total\n10\n"
    assert content.headers["etag"] == f'"{meta["checksum_sha256"]}"'
    assert_error(client.get(f"{A}/artifacts/art_missing"), 404, "artifact_not_found")
    user = client.get(f"{A}/sessions/{sid}/turns").json()["items"][0]
    assert user["parts"][1]["type"] == "data-attachment"

    tree = client.get(f"{A}/volume/tree").json()
    assert tree["directories"] == ["sessions"] and tree["truncated"] is False
    assert {f"sessions/{sid}/files/notes.txt", f"sessions/{sid}/artifacts/summary.md"} <= set(tree["paths"])
    mine = client.get(f"{A}/volume/tree", params={"root": f"/workspace/sessions/{sid}/files"}).json()
    assert mine == {"paths": [f"sessions/{sid}/files/notes.txt"], "directories": [], "truncated": False}
    assert client.get(f"{A}/volume/tree", params={"max_files": 1}).json()["truncated"] is True
    for bad in ("../etc", "/etc", "files"):
        assert_error(client.get(f"{A}/volume/tree", params={"root": bad}), 400, "volume_tree_invalid")


def test_an_oversize_upload_is_400(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[storage]\nmax_upload_mb = 0.05\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:

        def upload(size: int) -> httpx.Response:
            return client.post(f"{A}/attachments", files={"attachment": ("a.bin", b"x" * size)})

        assert upload(50_000).status_code == 201
        assert_error(upload(60_000), 400, "attachment_invalid")  # read by the route
        assert_error(upload(2_000_000), 400, "attachment_invalid")  # refused from its Content-Length

        def chunks() -> Iterator[bytes]:
            yield b'--b\r\nContent-Disposition: form-data; name="attachment"; filename="s.bin"\r\n\r\n'
            for _ in range(100):
                yield b"y" * 10_000

        multipart = {"content-type": "multipart/form-data; boundary=b"}
        streamed = client.post(f"{A}/attachments", content=chunks(), headers=multipart)  # cut off as it arrives
        assert_error(streamed, 400, "attachment_invalid")
        too_big = client.post(f"{A}/sessions", json={"title": "x" * 3_000_000})  # before any route: Fleet's 413
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "payload_too_large"


def test_skills_health_settings_feedback_and_what_is_not_served(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    cards = client.get(f"{A}/skills").json()
    assert cards and set(cards[0]) == {
        "id", "name", "description", "scope", "version", "trust", "affordances", "resources_available"
    }  # fmt: skip
    assert client.get(f"{A}/skills/{cards[0]['id']}").json() == cards[0]
    assert_error(client.get(f"{A}/skills/0b8a3f4e-0000-4000-8000-000000000000"), 404, "skill_not_found")
    ranked = client.get(f"{A}/skills", params={"q": cards[-1]["name"]}).json()
    assert ranked[0]["name"] == cards[-1]["name"]

    health = client.get(f"{P}/health").json()
    assert health["status"] == "ok" and health["app"] and health["version"]
    assert client.get(f"{P}/health/ready").json() == {"status": "ready", "database": "ok"}
    policy = client.get(f"{A}/settings").json()
    assert len(policy["revision"]) == 64 and {f["path"] for f in policy["fields"]} >= {"llm.model"}
    assert_error(client.patch(f"{A}/settings", json={"revision": policy["revision"]}), 422, "settings_policy_invalid")

    assert_error(client.get(f"{A}/files", params={"path": "."}), 503, "workspace_files_unavailable")
    assert_error(client.get(f"{A}/files/content", params={"path": "a"}), 503, "workspace_files_unavailable")
    assert_error(client.get(f"{A}/no/such/route"), 404, "not_found")

    scripted_lm.add("say hello", DONE)
    sid = new_session(client)
    chosen = [{"id": cards[0]["id"], "expected_version": cards[0]["version"]}]  # a card preselected for the turn
    trace = turn(client, sid, "say hello", "k", skill_selections=chosen)[-1]["traceId"]
    events = client.get(f"/api/sessions/{sid}/turns/{trace}/events").text
    assert f'"skills":["{cards[0]["name"]}"]' in events.replace(" ", "")
    body = {"trace_id": trace, "value": False, "comment": "wrong"}
    marked = client.post(f"{A}/sessions/{sid}/traces/feedback", json=body)
    assert marked.json() == {"trace_id": trace, "name": "user_feedback", "value": False, "assessment_id": None}
    native = client.get(f"/api/sessions/{sid}/turns/{trace}/feedback").json()
    assert (native["rating"], native["note"]) == ("bad", "wrong")
    missing = {"trace_id": "turn_missing", "value": True}
    assert_error(client.post(f"{A}/sessions/{sid}/traces/feedback", json=missing), 404, "feedback_trace_not_found")


def test_the_profile_serves_its_own_document_and_stays_out_of_fleets(client: httpx.Client) -> None:
    own = client.get(f"{A}/openapi.json").json()
    assert own["servers"] == [{"url": P}]
    assert {"/api/sessions", "/api/sessions/{session_id}/turns", "/api/runs/{run_id}/cancellation"} <= set(own["paths"])
    assert not any(path.startswith(P) for path in client.get("/api/openapi.json").json()["paths"])


@pytest.mark.parametrize("path", ["/api/sessions", "/api/sessions/x/turns"])
def test_fleets_own_api_keeps_its_envelope(client: httpx.Client, path: str) -> None:
    response = client.get(path.replace("/x/", "/nope/"))
    assert response.status_code in (200, 404) and "code" not in response.json()
