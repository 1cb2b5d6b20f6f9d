"""The disk can fill and nothing is lost, over a real server on a small real disk (an 8 MB tmpfs).

A turn whose sandbox writes more than the disk holds fails at once, naming the disk, and leaves no
hidden partial file behind; an upload to a full disk is a 507 with nothing half-written; uploads and
workspace writes obey the workspace quota (``[sandbox] workspace_mb`` / ``workspace_files``).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from disk_fill import fill_disk
from live_api import Frame, LiveServer, assert_error, events_of, iter_frames
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.sandbox import probe_bwrap

# A sandbox pre-started before the test mounted its disk would see the folder beneath the mount: none here.
COLD_SANDBOXES = "[sandbox]\npool_size = 0\n"
FILL = "open('/workspace/artifacts/big.bin', 'wb').write(b'x' * (20 << 20)); print('written')"


def _on(disk: Path, fleet_env: dict[str, str], toml: str = "") -> Settings:
    home = disk / "home"
    home.mkdir()
    config = disk.parent / "fleet.toml"
    config.write_text(toml)
    return load_settings({**fleet_env, "FLEET_HOME": str(home), "FLEET_CONFIG": str(config)})


def _upload(client: httpx.Client, session_id: str, name: str, data: bytes) -> httpx.Response:
    return client.post("/api/attachments", data={"session_id": session_id}, files={"file": (name, data)})


def _leftovers(root: Path) -> list[str]:
    """Hidden files in the workspace: temporaries or partials a failed write left behind."""
    return [str(p.relative_to(root)) for p in root.rglob(".*")]


def _final_event(base_url: str, path: str, wait_s: float = 60) -> list[Frame]:
    """The turn's whole stream, read in the background; fails when no terminal event comes in ``wait_s``."""
    frames: list[Frame] = []

    def read() -> None:
        with httpx.Client(base_url=base_url, timeout=wait_s * 2) as c, c.stream("GET", path) as r:
            frames.extend(events_of(r))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(wait_s)
    assert not reader.is_alive(), f"no terminal event within {wait_s} s: {[f.event for f in frames]}"
    return frames


def test_a_turn_that_fills_the_disk_fails_naming_it_and_frees_it(
    small_tmpfs: Path, fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    if probe_bwrap() is not None:
        pytest.skip(f"the local sandbox cannot run here: {probe_bwrap()}")
    settings = _on(small_tmpfs, fleet_env, COLD_SANDBOXES)
    scripted_lm.add("fill the disk", [step("Write a big file.", FILL), step("Done.", "SUBMIT(answer='done')")])
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        turn = client.post(
            f"/api/sessions/{session_id}/turns", json={"task": "fill the disk"}, headers={"Prefer": "respond-async"}
        ).json()
        url = f"/api/sessions/{session_id}/turns/{turn['turn_id']}"
        frames = _final_event(live.url, f"{url}/events")
        assert frames[-1].event == "turn.failed", [(f.event, f.envelope["data"]) for f in frames]
        error = frames[-1].envelope["data"]["error"]
        assert error["type"] == "disk_full", error
        assert str(small_tmpfs) in error["message"] and "artifacts/big.bin" in error["message"], error
        row = client.get(url).json()
        assert row["status"] == "failed" and row["error"]["type"] == "disk_full", row
        workspace = settings.workspaces_dir / session_id
        assert _leftovers(workspace) == []
        assert shutil.disk_usage(small_tmpfs).free > 4 << 20, "the failed copy still holds the disk"


def test_an_upload_to_a_full_disk_is_507_and_leaves_nothing(small_tmpfs: Path, fleet_env: dict[str, str]) -> None:
    settings = _on(small_tmpfs, fleet_env)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        assert _upload(client, session_id, "first.csv", b"a,b\n1,2\n").status_code == 201
        fill_disk(small_tmpfs / "filler")
        try:
            error = assert_error(_upload(client, session_id, "data.bin", os.urandom(300_000)), 507, "disk_full")
            assert str(small_tmpfs) in error["message"], error
            files = settings.workspaces_dir / session_id / "files"
            assert sorted(p.name for p in files.iterdir()) == ["first.csv"]
            assert _leftovers(settings.workspaces_dir / session_id) == []
            put = client.put(
                f"/api/sessions/{session_id}/workspace/files/files/put.bin",
                content=os.urandom(300_000),
                headers={"content-type": "application/octet-stream"},
            )
            assert_error(put, 507, "disk_full")
            assert sorted(p.name for p in files.iterdir()) == ["first.csv"]
        finally:
            (small_tmpfs / "filler").unlink()
        assert _upload(client, session_id, "data.bin", b"room again").status_code == 201


def test_uploads_and_writes_obey_the_workspace_size(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[sandbox]\nworkspace_mb = 1\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        assert _upload(client, session_id, "a.bin", b"a" * 600_000).status_code == 201
        error = assert_error(_upload(client, session_id, "b.bin", b"b" * 600_000), 507, "workspace_quota")
        assert "workspace_mb" in error["message"], error
        put = client.put(
            f"/api/sessions/{session_id}/workspace/files/files/c.bin",
            content=b"c" * 600_000,
            headers={"content-type": "application/octet-stream"},
        )
        assert "workspace_mb" in assert_error(put, 507, "workspace_quota")["message"]
        files = settings.workspaces_dir / session_id / "files"
        assert sorted(p.name for p in files.iterdir()) == ["a.bin"]
        replaced = client.put(  # a replacement counts what it frees
            f"/api/sessions/{session_id}/workspace/files/files/a.bin",
            content=b"A" * 700_000,
            headers={"content-type": "application/octet-stream"},
        )
        assert replaced.status_code == 200, replaced.text


def test_uploads_and_writes_obey_the_workspace_file_count(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[sandbox]\nworkspace_files = 16\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config)})
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        statuses = [_upload(client, session_id, f"f{n}.txt", f"{n}".encode()).status_code for n in range(20)]
        assert 201 in statuses and statuses[-1] == 507, statuses
        error = assert_error(_upload(client, session_id, "more.txt", b"more"), 507, "workspace_quota")
        assert "workspace_files" in error["message"], error
        put = client.put(
            f"/api/sessions/{session_id}/workspace/files/deep/er/new.txt",
            content=b"new",
            headers={"content-type": "application/octet-stream"},
        )
        assert "workspace_files" in assert_error(put, 507, "workspace_quota")["message"]
        assert not (settings.workspaces_dir / session_id / "deep").exists()


def test_an_artifact_the_store_has_no_room_for_fails_the_turn_naming_the_disk(
    small_tmpfs: Path, fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    if os.environ.get("FLEET_TEST_DATABASE_URL"):
        pytest.skip("fills the disk of a SQLite store; this run's store is elsewhere")
    if probe_bwrap() is not None:
        pytest.skip(f"the local sandbox cannot run here: {probe_bwrap()}")
    settings = _on(small_tmpfs, fleet_env, COLD_SANDBOXES)
    code = "import os; open('/workspace/artifacts/chart.bin', 'wb').write(os.urandom(4 << 20)); print('written')"
    scripted_lm.add("a big chart", [step("Draw.", code), step("Done.", "SUBMIT(answer='done')")])
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        turn = client.post(
            f"/api/sessions/{session_id}/turns", json={"task": "a big chart"}, headers={"Prefer": "respond-async"}
        ).json()
        url = f"/api/sessions/{session_id}/turns/{turn['turn_id']}"
        frames = _final_event(live.url, f"{url}/events")
        assert frames[-1].event == "turn.failed", [f.event for f in frames]
        error = frames[-1].envelope["data"]["error"]
        assert error["type"] == "disk_full" and str(small_tmpfs) in error["message"], error
        assert (settings.workspaces_dir / session_id / "artifacts" / "chart.bin").stat().st_size == 4 << 20
        assert client.get(url).json()["error"]["type"] == "disk_full"


@pytest.mark.slow
def test_a_watcher_that_comes_while_the_disk_stays_full_still_gets_the_end(
    small_tmpfs: Path, fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    settings = _on(small_tmpfs, fleet_env)
    steps = [{"delay": 0.3, **step(f"Step {i}.", f"print('step {i}')")} for i in range(30)]
    scripted_lm.add("runs on", [*steps, step("Done.", "SUBMIT(answer='done')")])
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        session_id = client.post("/api/sessions", json={}).json()["session_id"]
        turn = client.post(
            f"/api/sessions/{session_id}/turns", json={"task": "runs on"}, headers={"Prefer": "respond-async"}
        ).json()
        url = f"/api/sessions/{session_id}/turns/{turn['turn_id']}/events"
        with client.stream("GET", url) as r:
            next(f for f in iter_frames(r) if f.event == "output")  # the turn is under way
        fill_disk(small_tmpfs / "filler")
        try:
            first = _final_event(live.url, url)
            later = _final_event(live.url, url)  # the store still cannot say how the turn ended
            assert later[-1].event == first[-1].event == "turn.failed", [f.event for f in later]
            assert [(f.id, f.data) for f in later] == [(f.id, f.data) for f in first]
        finally:
            (small_tmpfs / "filler").unlink()
