"""The workspace tree: bounded, read-only, and no way out of the workspace."""

from __future__ import annotations

import os
import threading

import httpx
import pytest
from live_api import assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings
from fleet_kernel.sandbox import _confine, probe_bwrap
from fleet_kernel.workspace import Workspace


def make_workspace(settings: Settings, session_id: str) -> Workspace:
    ws = Workspace.for_session(settings.workspaces_dir, session_id)
    (ws.root / "files" / "data.csv").write_text("a,b\n1,2\n")
    deep = ws.root / "artifacts" / "one" / "two" / "three"
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("leaf")
    return ws


def tree(client: httpx.Client, session_id: str, **params: object) -> httpx.Response:
    return client.get("/api/volume/tree", params={"session_id": session_id, **params})


def test_lists_workspace(client: httpx.Client, session_id: str, settings: Settings) -> None:
    make_workspace(settings, session_id)
    body = tree(client, session_id).json()
    assert body["session_id"] == session_id and body["truncated"] is False
    by_path = {e["path"]: e for e in body["entries"]}
    assert by_path["files/data.csv"]["type"] == "file" and by_path["files/data.csv"]["size"] == 8
    assert by_path["files/data.csv"]["mime"] == "text/csv"
    assert by_path["artifacts/one"]["type"] == "dir"
    assert "artifacts/one/two/three" not in by_path  # default depth 3
    deep = tree(client, session_id, depth=5).json()
    assert "artifacts/one/two/three/leaf.txt" in {e["path"] for e in deep["entries"]}
    sub = tree(client, session_id, path="files").json()
    assert [e["path"] for e in sub["entries"]] == ["files/data.csv"]


def test_entry_limit(client: httpx.Client, session_id: str, settings: Settings) -> None:
    ws = make_workspace(settings, session_id)
    for i in range(30):
        (ws.root / "files" / f"f{i:02}.txt").write_text("x")
    body = tree(client, session_id, limit=10).json()
    assert len(body["entries"]) == 10 and body["truncated"] is True
    assert_error(tree(client, session_id, limit=100_000), 422)
    assert_error(tree(client, session_id, depth=0), 422)


def test_empty_before_first_turn(client: httpx.Client, session_id: str) -> None:
    body = tree(client, session_id).json()
    assert body["entries"] == [] and body["truncated"] is False


def test_path_escapes_refused(client: httpx.Client, session_id: str, settings: Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ws = make_workspace(settings, session_id)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, ws.root / "files" / "link-out")
    os.symlink("/etc/passwd", ws.root / "files" / "passwd")
    for path in (
        "..",
        "../..",
        "files/../../",
        "/etc",
        "/",
        "files/../..",
        "..\\..",
        "C:/Windows",
        "files/link-out",
        "files/link-out/secret.txt",
        "files/passwd",
        "a\x00b",
    ):
        error = assert_error(tree(client, session_id, path=path), 422)
        assert error["code"] in ("invalid_path", "validation_error"), (path, error)
    listing = tree(client, session_id, path="files").json()["entries"]
    kinds = {e["name"]: e["type"] for e in listing}
    assert kinds["link-out"] == "symlink" and kinds["passwd"] == "symlink"
    assert not any("secret" in e["path"] for e in tree(client, session_id, depth=8).json()["entries"])


def test_read_only_and_unknown(client: httpx.Client, session_id: str) -> None:
    assert_error(client.post("/api/volume/tree", params={"session_id": session_id}), 405)
    assert_error(client.delete("/api/volume/tree", params={"session_id": session_id}), 405)
    assert_error(tree(client, "ses_missing"), 404, "not_found")
    assert_error(client.get("/api/volume/tree"), 422, "validation_error")
    assert_error(tree(client, session_id, path="nope"), 404, "not_found")


def test_names_that_are_not_utf8_are_listed_escaped(client: httpx.Client, session_id: str, settings: Settings) -> None:
    ws = make_workspace(settings, session_id)
    (ws.root / "artifacts" / os.fsdecode(b"bad-\xff\xfe.txt")).write_bytes(b"x")
    (ws.root / "files" / os.fsdecode(b"dir-\xff")).mkdir()
    (ws.root / "files" / os.fsdecode(b"dir-\xff") / "inner.txt").write_bytes(b"x")
    (ws.root / "files" / "line\nbreak.txt").write_bytes(b"x")
    response = tree(client, session_id, depth=4)
    assert response.status_code == 200, response.text
    paths = {e["path"] for e in response.json()["entries"]}
    assert {
        "artifacts/bad-\\xff\\xfe.txt",
        "files/dir-\\xff",
        "files/dir-\\xff/inner.txt",
        "files/line\nbreak.txt",
        "files/data.csv",
    } <= paths


@pytest.mark.slow
def test_a_folder_swapped_for_a_link_while_listed_is_never_listed_through(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sandbox code (on a host without the seccomp filter, so it can make links) keeps swapping a folder
    for a link to the host's ``/`` while the tree is listed over and over."""
    if probe_bwrap() is not None:
        pytest.skip(f"local sandbox unavailable: {probe_bwrap()}")
    monkeypatch.setattr(_confine, "seccomp_program", lambda: None)
    scripted_lm.add(
        "*",
        [
            step(
                "Swap.",
                """
import os, time
base = '/workspace/artifacts'
os.makedirs(base + '/d/inner', exist_ok=True)
open(base + '/ready', 'w').write('1')
end = time.time() + 2.5
while time.time() < end:
    os.rename(base + '/d', base + '/d.real')
    os.symlink('/', base + '/d')
    os.unlink(base + '/d')
    os.rename(base + '/d.real', base + '/d')
SUBMIT(answer='swapped')
""",
            )
        ],
    )
    frames: list = []
    turn = threading.Thread(target=lambda: frames.extend(run_turn(client, session_id, "swap a folder for a link")))
    turn.start()
    host_names = set(os.listdir("/")) - {"d", "inner"}
    seen: set[str] = set()
    statuses: set[int] = set()
    while turn.is_alive():
        for path in ("artifacts", "artifacts/d"):
            response = tree(client, session_id, path=path, depth=3)
            statuses.add(response.status_code)
            if response.status_code == 200:
                seen |= {e["name"] for e in response.json()["entries"] if e["path"].startswith("artifacts/d/")}
    turn.join()
    assert frames and frames[-1].event == "turn.completed", frames[-1:]
    assert not seen & host_names, sorted(seen & host_names)
    assert statuses <= {200, 404, 422}, statuses  # a folder changing under the listing is no server error
