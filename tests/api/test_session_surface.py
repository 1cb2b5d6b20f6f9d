"""The session surface over HTTP: paging, search and archive; each session's effective settings and
own models; and its workspace files (read, write, delete, stat) with the rules that keep them safe."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import httpx
import pytest
from live_api import LiveServer, assert_error, frames_until, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings

DONE = [step("Finish.", "SUBMIT(answer='done')")]
OCTETS = {"content-type": "application/octet-stream"}


def test_paging_search_and_archive(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    tag = uuid.uuid4().hex[:8]  # a PostgreSQL test database keeps other tests' sessions: page through ours
    made = [
        client.post("/api/sessions", json={"title": f"{tag} bulk {i:03d}"}).json()["session_id"] for i in range(120)
    ]
    scripted_lm.add("forecast the quarterly revenue", DONE)
    run_turn(client, made[10], "forecast the quarterly revenue")

    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 50, "q": tag, **({"cursor": cursor} if cursor else {})}
        body = client.get("/api/sessions", params=params).json()
        seen += [s["session_id"] for s in body["sessions"]]
        cursor, pages = body["next_cursor"], pages + 1
        if cursor is None:
            break
    assert pages == 3 and seen == list(reversed(made))  # newest first, each once

    found = client.get("/api/sessions", params={"q": "QUARTERLY"}).json()["sessions"]
    assert made[10] in [s["session_id"] for s in found] and not set(made[:10]) & {s["session_id"] for s in found}
    titles = [s["title"] for s in client.get("/api/sessions", params={"q": f"{tag} bulk 007"}).json()["sessions"]]
    assert titles == [f"{tag} bulk 007"]

    archived = client.patch(f"/api/sessions/{made[10]}", json={"archived": True}).json()
    assert archived["archived"] is True and archived["title"] == f"{tag} bulk 010"
    listed = [s["session_id"] for s in client.get("/api/sessions", params={"q": tag}).json()["sessions"]]
    assert made[10] not in listed and len(listed) == 119
    only = client.get("/api/sessions", params={"archived": "true", "q": tag}).json()["sessions"]
    assert [s["session_id"] for s in only] == [made[10]]
    assert len(client.get("/api/sessions", params={"archived": "all", "q": tag}).json()["sessions"]) == 120
    client.patch(f"/api/sessions/{made[10]}", json={"archived": False})
    assert made[10] in [s["session_id"] for s in client.get("/api/sessions", params={"q": tag}).json()["sessions"]]

    assert_error(client.get("/api/sessions", params={"cursor": "bogus"}), 422, "validation_error")
    assert_error(client.get("/api/sessions", params={"archived": "maybe"}), 422, "validation_error")
    assert_error(client.get("/api/sessions", params={"limit": 0}), 422, "validation_error")
    assert_error(client.patch(f"/api/sessions/{made[0]}", json={"archived": None}), 422, "validation_error")


def test_config_and_model_override(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    config = client.get(f"/api/sessions/{session_id}/config")
    assert config.status_code == 200, config.text
    body = config.json()
    assert body["model"] == "openai/scripted" and body["model_source"] == "settings"
    assert body["sub_model"] == "openai/scripted" and body["sandbox"]
    assert {"max_iters", "max_llm_calls", "timeout_s"} <= set(body["limits"])
    assert body["history"]["window_turns"] >= 0 and body["skills"] == []
    assert "sk-test" not in config.text and "api_key" not in config.text

    changed = client.patch(f"/api/sessions/{session_id}", json={"model": "openai/other", "sub_model": "openai/small"})
    assert changed.json()["model"] == "openai/other" and changed.json()["sub_model"] == "openai/small"
    body = client.get(f"/api/sessions/{session_id}/config").json()
    assert (body["model"], body["sub_model"], body["model_source"]) == ("openai/other", "openai/small", "session")

    scripted_lm.add("use the session model", DONE)
    frames = run_turn(client, session_id, "use the session model")
    assert frames[0].envelope["data"]["model"] == "openai/other"
    assert frames[-1].event == "turn.completed"
    assert any(r.get("model") == "other" for r in scripted_lm.requests)
    turn = client.get(f"/api/sessions/{session_id}/turns/{frames[0].envelope['turn_id']}").json()
    assert turn["model"] == "openai/other"

    client.patch(f"/api/sessions/{session_id}", json={"model": None})
    assert client.get(f"/api/sessions/{session_id}/config").json()["model"] == "openai/scripted"
    assert_error(client.get("/api/sessions/ses_missing/config"), 404, "not_found")


def test_workspace_files_over_http(client: httpx.Client, session_id: str, settings: Settings) -> None:
    files = f"/api/sessions/{session_id}/workspace/files"
    put = client.put(f"{files}/files/notes/a.txt", content=b"hello\n", headers=OCTETS)
    assert put.status_code == 200, put.text
    stat = put.json()
    assert stat["path"] == "files/notes/a.txt" and stat["size"] == 6 and len(stat["sha256"]) == 64
    assert client.get(f"/api/sessions/{session_id}/workspace/stat/files/notes/a.txt").json() == stat
    got = client.get(f"{files}/files/notes/a.txt")
    assert got.content == b"hello\n" and got.headers["x-content-type-options"] == "nosniff"
    root = settings.workspaces_dir / session_id
    assert (root / "files/notes/a.txt").read_bytes() == b"hello\n"

    client.put(f"{files}/files/notes/a.txt", content=b"replaced", headers=OCTETS)
    assert client.get(f"{files}/files/notes/a.txt").content == b"replaced"
    assert client.delete(f"{files}/files/notes/a.txt").status_code == 204
    assert_error(client.get(f"{files}/files/notes/a.txt"), 404, "not_found")
    assert_error(client.delete(f"{files}/files/notes/a.txt"), 404, "not_found")

    for escape in ("..%2F..%2Fsecret.txt", "files/..%2F..%2F..%2Fetc%2Fpasswd", "%2E%2E/x"):
        assert_error(client.put(f"{files}/{escape}", content=b"x", headers=OCTETS), 422, "validation_error")
        assert_error(client.get(f"{files}/{escape}"), 422, "validation_error")
    assert not (settings.workspaces_dir / "secret.txt").exists()

    # A link planted in the workspace is never followed, to read or to write.
    outside = settings.home / f"outside-{session_id}"  # the home may be shared by other tests
    outside.mkdir()
    (outside / "target.txt").write_text("private")
    os.symlink(outside, root / "files" / "link")
    os.symlink(outside / "target.txt", root / "files" / "file-link")
    assert_error(client.get(f"{files}/files/link/target.txt"), 404, "not_found")
    assert_error(client.get(f"{files}/files/file-link"), 404, "not_found")
    assert_error(client.put(f"{files}/files/link/target.txt", content=b"owned", headers=OCTETS), 422)
    assert client.put(f"{files}/files/file-link", content=b"mine", headers=OCTETS).status_code == 200
    assert (outside / "target.txt").read_text() == "private"  # the link was replaced, not written through

    # The body must be raw bytes with its own type; a page on another site cannot send one.
    assert_error(
        client.put(f"{files}/files/b.txt", content=b"x", headers={"content-type": "text/plain"}),
        415,
        "unsupported_media_type",
    )
    cross = client.put(f"{files}/files/b.txt", content=b"x", headers={**OCTETS, "origin": "https://evil.example"})
    assert_error(cross, 403, "cross_origin_refused")


@pytest.mark.slow
def test_workspace_writes_wait_for_the_turn(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("hold the workspace", [
        step("Wait.", "import time\nprint('waiting', flush=True)\ntime.sleep(3)"),
        step("Done.", "SUBMIT(answer='done')"),
    ])  # fmt: skip
    files = f"/api/sessions/{session_id}/workspace/files"
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "hold the workspace"}) as stream:
        turn_id = frames_until(stream, "output")[0].envelope["turn_id"]
        busy = assert_error(client.put(f"{files}/files/c.txt", content=b"x", headers=OCTETS), 409, "session_busy")
        assert "running" in busy["message"]
        assert_error(client.delete(f"{files}/files/c.txt"), 409, "session_busy")
        assert client.get(f"/api/sessions/{session_id}/workspace/stat/memory/MEMORIES.md").status_code == 200
    deadline = time.monotonic() + 60  # leaving the stream does not stop the turn: wait for it to end
    while client.get(f"/api/sessions/{session_id}/turns/{turn_id}").json()["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert client.put(f"{files}/files/c.txt", content=b"x", headers=OCTETS).status_code == 200


def test_workspace_upload_limit_is_413(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[storage]\nmax_upload_mb = 0.05\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:
        sid = client.post("/api/sessions").json()["session_id"]
        url = f"/api/sessions/{sid}/workspace/files/files/big.bin"
        assert client.put(url, content=b"x" * 50_000, headers=OCTETS).status_code == 200
        error = assert_error(client.put(url, content=b"x" * 60_000, headers=OCTETS), 413, "payload_too_large")
        assert "max_upload_mb" in error["message"]
