"""Attachments: multipart upload into the session workspace, durable lookup, size limit."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import httpx
import pytest
from live_api import LiveServer, assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.sandbox import _confine, probe_bwrap


def upload(client: httpx.Client, session_id: str, name: str, data: bytes, mime: str = "text/csv") -> httpx.Response:
    return client.post("/api/attachments", data={"session_id": session_id}, files={"file": (name, data, mime)})


def test_upload_lands_in_workspace(client: httpx.Client, session_id: str, settings: Settings) -> None:
    data = b"region,sales\nnorth,10\nsouth,20\n"
    response = upload(client, session_id, "sales.csv", data)
    assert response.status_code == 201, response.text
    att = response.json()
    assert att["path"] == "files/sales.csv" and att["size"] == len(data)
    assert att["sha256"] == hashlib.sha256(data).hexdigest() and att["mime"] == "text/csv"
    assert (settings.workspaces_dir / session_id / "files" / "sales.csv").read_bytes() == data
    assert client.get(f"/api/attachments/{att['attachment_id']}").json() == att
    content = client.get(f"/api/attachments/{att['attachment_id']}/content")
    assert content.content == data and content.headers["content-type"].startswith("text/csv")


def test_same_name_never_overwrites(client: httpx.Client, session_id: str, settings: Settings) -> None:
    first = upload(client, session_id, "notes.txt", b"one", "text/plain").json()
    again = upload(client, session_id, "notes.txt", b"one", "text/plain").json()
    other = upload(client, session_id, "notes.txt", b"two", "text/plain").json()
    assert first["path"] == again["path"] == "files/notes.txt"
    assert other["path"] == "files/notes-2.txt"
    files = settings.workspaces_dir / session_id / "files"
    assert (files / "notes.txt").read_bytes() == b"one" and (files / "notes-2.txt").read_bytes() == b"two"


def test_hostile_filenames_stay_in_files(client: httpx.Client, session_id: str, settings: Settings) -> None:
    for name in ("../../escape.txt", "/etc/passwd", "..", "a/b/../../c.txt"):
        att = upload(client, session_id, name, name.encode(), "text/plain").json()
        assert att["path"].startswith("files/") and "/" not in att["path"][len("files/") :]
    assert not (settings.workspaces_dir / "escape.txt").exists()


def test_errors(client: httpx.Client, session_id: str) -> None:
    assert_error(upload(client, "ses_missing", "a.txt", b"x"), 404, "not_found")
    no_file = client.post("/api/attachments", data={"session_id": session_id})  # a urlencoded form
    assert_error(no_file, 415, "unsupported_media_type")
    assert_error(client.post("/api/attachments", files={"file": ("a.txt", b"x")}), 422, "validation_error")
    assert_error(client.get("/api/attachments/att_missing"), 404, "not_found")
    assert_error(client.get("/api/attachments/att_missing/content"), 404, "not_found")


def test_size_limit_is_413(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[storage]\nmax_upload_mb = 0.05\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url) as client:
        sid = client.post("/api/sessions").json()["session_id"]
        assert upload(client, sid, "ok.bin", b"x" * 50_000).status_code == 201
        error = assert_error(upload(client, sid, "big.bin", b"x" * 60_000), 413, "payload_too_large")
        assert "max_upload_mb" in error["message"]
        # Far over the limit: refused from Content-Length before the body is read.
        assert_error(upload(client, sid, "huge.bin", b"x" * 2_000_000), 413, "payload_too_large")

        # Streamed without a length: cut off while it arrives.
        def chunks():  # type: ignore[no-untyped-def]
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="s.bin"\r\n\r\n'
            for _ in range(100):
                yield b"y" * 10_000

        streamed = client.post(
            "/api/attachments", content=chunks(), headers={"content-type": "multipart/form-data; boundary=b"}
        )
        assert_error(streamed, 413, "payload_too_large")
        assert client.get("/api/health").status_code == 200
        assert_error(client.post("/api/sessions", json={"title": "x" * 3_000_000}), 413, "payload_too_large")


@pytest.mark.slow
def test_uploads_never_write_through_links_code_keeps_planting(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Sandbox code (on a host without the seccomp filter, so it can make links) keeps planting links to a
    host file under the names an upload would take, while the same name is uploaded over and over."""
    if probe_bwrap() is not None:
        pytest.skip(f"local sandbox unavailable: {probe_bwrap()}")
    monkeypatch.setattr(_confine, "seccomp_program", lambda: None)
    victim = tmp_path / "victim.txt"
    victim.write_text("host file, untouched")
    victim.chmod(0o600)
    scripted_lm.add(
        "*",
        [
            step(
                "Plant.",
                f"""
import os, time
names = ['/workspace/files/report.txt'] + [f'/workspace/files/report-{{n}}.txt' for n in range(2, 40)]
end = time.time() + 2.5
while time.time() < end:
    for name in names:
        try:
            os.unlink(name)
            os.symlink({str(victim)!r}, name)
            os.unlink(name)
        except OSError:
            pass
SUBMIT(answer='planted')
""",
            )
        ],
    )
    frames: list = []
    turn = threading.Thread(target=lambda: frames.extend(run_turn(client, session_id, "plant links")))
    turn.start()
    statuses: set[int] = set()
    n = 0
    while turn.is_alive():
        n += 1
        statuses.add(upload(client, session_id, "report.txt", f"upload {n}".encode(), "text/plain").status_code)
    turn.join()
    assert victim.read_text() == "host file, untouched" and victim.stat().st_mode & 0o777 == 0o600
    assert frames and frames[-1].event == "turn.completed", frames[-1:]
    assert statuses <= {201, 422}, statuses
