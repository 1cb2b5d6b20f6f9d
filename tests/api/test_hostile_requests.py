"""One request (or a few hundred sockets) cannot take the server down: large files stream, idle
connections give way to real clients, health is cheap and discloses nothing, origins match exactly,
and a mistyped path is a 404 whatever it carries."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from live_api import LiveServer, assert_error
from sqlalchemy import Connection, event

from fleet_api.server import check_bind
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import ConfigError

LIVENESS_S = 30  # generous: a server that is up answers in milliseconds
SPARSE_BYTES = 250 * 1024 * 1024
RSS_GROWTH_LIMIT = 100 * 1024 * 1024
TOKEN = "Kq3-vX9_aZ0pLm7Rt2Yw5Nc8Hb1Ue4Gd6Sf"  # 36 characters of many kinds, as secrets.token_urlsafe makes


@pytest.fixture
def idle_sockets() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


# ---------------------------------------------------------------------- a large workspace file


class PeakRss:
    """The largest resident set of this process (the server runs in a thread of it) while running."""

    def __init__(self) -> None:
        self.process = psutil.Process(os.getpid())
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


@pytest.mark.slow
def test_a_large_workspace_file_streams_from_disk(client: httpx.Client, session_id: str, settings: Settings) -> None:
    folder = settings.workspaces_dir / session_id / "files"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "huge.bin", "wb") as f:
        f.truncate(SPARSE_BYTES)  # sparse: no disk used, but every byte reads as zero
    url = f"/api/sessions/{session_id}/workspace/files/files/huge.bin"
    stat = client.get(f"/api/sessions/{session_id}/workspace/stat/files/huge.bin").json()
    received = 0
    with PeakRss() as rss, client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["etag"] == f'"{stat["sha256"]}"'
        assert response.headers["content-length"] == str(SPARSE_BYTES)
        for chunk in response.iter_raw(1 << 20):
            assert not chunk.strip(b"\0")
            received += len(chunk)
    assert received == SPARSE_BYTES
    assert rss.growth < RSS_GROWTH_LIMIT, f"serving the file grew the server by {rss.growth >> 20} MB"
    # a small file still comes whole, and a missing one is still a 404 before any byte is sent
    (folder / "small.txt").write_bytes(b"hello")
    assert client.get(f"/api/sessions/{session_id}/workspace/files/files/small.txt").content == b"hello"
    assert_error(client.get(f"/api/sessions/{session_id}/workspace/files/files/none.txt"), 404, "not_found")


# ---------------------------------------------------------------------- idle connections


def _open_idle(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def test_idle_connections_give_way_to_a_token_holder(
    token_settings: Settings, idle_sockets: list[socket.socket]
) -> None:
    token = token_settings.api_token
    assert token is not None
    authed = {"Authorization": f"Bearer {token.get_secret_value()}"}
    with LiveServer(token_settings, max_connections=200, header_timeout_s=600) as live:
        idle_sockets += _open_idle(live.port, 250)  # more than the cap; none sends a byte
        with httpx.Client(base_url=live.url, timeout=LIVENESS_S) as fresh:
            assert fresh.get("/api/sessions", headers=authed).status_code == 200
        with httpx.Client(base_url=live.url, timeout=LIVENESS_S) as fresh:
            assert fresh.get("/api/health").status_code == 200


# ---------------------------------------------------------------------- /api/health


def test_health_does_not_write_on_every_call(live: LiveServer, client: httpx.Client) -> None:
    store = live.app.state.fleet.store
    engines = [e for e in (store._file_engine, store.engine.sync_engine) if e is not None]
    writes: list[object] = []

    def count(conn: Connection) -> None:
        if conn.get_execution_options().get("fleet_write"):
            writes.append(conn)

    for engine in engines:
        event.listen(engine, "begin", count)
    try:
        client.get("/api/health")
        writes.clear()
        started = time.monotonic()
        for _ in range(60):
            assert client.get("/api/health").json()["store"]["ok"] is True
        elapsed = time.monotonic() - started
    finally:
        for engine in engines:
            event.remove(engine, "begin", count)
    assert len(writes) <= elapsed + 2, f"{len(writes)} write transactions for 60 health checks in {elapsed:.1f} s"


def test_health_shows_no_absolute_paths(token_settings: Settings, settings: Settings) -> None:
    if not settings.database_url.startswith("sqlite"):
        pytest.skip("deletes the file of a SQLite store")
    with LiveServer(token_settings) as live, httpx.Client(base_url=live.url, timeout=LIVENESS_S) as client:
        database = Path(token_settings.database_url.split(":///", 1)[1])
        for path in (database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")):
            path.unlink(missing_ok=True)
        health = client.get("/api/health")
        assert health.status_code == 503 and "deleted" in health.json()["store"]["detail"]
        assert str(token_settings.home) not in health.text and str(database.parent) not in health.text
        assert database.name in health.text  # it still says which file


# ---------------------------------------------------------------------- origins and tokens


def test_another_port_of_loopback_is_another_origin(client: httpx.Client) -> None:
    port = client.base_url.port
    other = {"Origin": f"http://127.0.0.1:{port + 1}"}
    refused = assert_error(client.post("/api/sessions", json={}, headers=other), 403, "cross_origin_refused")
    assert f"127.0.0.1:{port + 1}" in refused["message"]
    assert_error(client.post("/api/sessions", json={}, headers={"Origin": "http://localhost"}), 403)
    assert_error(client.post("/api/sessions", json={}, headers={"Origin": f"ftp://127.0.0.1:{port}"}), 403)
    own = {"Origin": f"http://127.0.0.1:{port}"}
    assert client.post("/api/sessions", json={}, headers=own).status_code == 201


def test_a_network_bind_needs_a_long_random_token(fleet_env: dict[str, str]) -> None:
    for short in ("x", "s3cret-token-for-tests", "y" * 31):
        with pytest.raises(ConfigError, match=r"at least 32 characters.*secrets.token_urlsafe\(32\)"):
            check_bind("0.0.0.0", load_settings({**fleet_env, "FLEET_API_TOKEN": short}))
    for plain in ("t" * 40, "abab" * 10, "012345678" * 5):  # long enough, but 9 different characters at most
        with pytest.raises(ConfigError, match=r"at least 10 different characters.*secrets.token_urlsafe\(32\)"):
            check_bind("0.0.0.0", load_settings({**fleet_env, "FLEET_API_TOKEN": plain}))
    check_bind("0.0.0.0", load_settings({**fleet_env, "FLEET_API_TOKEN": TOKEN}))
    check_bind("127.0.0.1", load_settings({**fleet_env, "FLEET_API_TOKEN": "x"}))  # loopback: any token


# ---------------------------------------------------------------------- unknown paths


def test_unknown_paths_are_404_whatever_the_method(client: httpx.Client) -> None:
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        for headers, body in [({}, None), ({"content-type": "text/plain"}, b"x"), ({"content-type": "a/b"}, b"{}")]:
            response = client.request(method, "/api/sesions/x", headers=headers, content=body)
            assert_error(response, 404, "not_found")
    assert_error(client.put("/api/nope", content=b"x", headers={"content-type": "text/plain"}), 404, "not_found")
    # a known path still asks for JSON
    assert_error(client.post("/api/sessions", content=b"x", headers={"content-type": "text/plain"}), 415)


# ---------------------------------------------------------------------- output schemas


def test_a_deeply_nested_schema_value_is_422_at_submit(client: httpx.Client, session_id: str) -> None:
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    schema = {"type": "object", "properties": {"a": {"type": "array", "default": deep}}}
    response = client.post(f"/api/sessions/{session_id}/turns", json={"task": "t", "output_schema": schema})
    error = assert_error(response, 422, "validation_error")
    assert "nests JSON deeper than" in error["message"] and "default" in error["message"]
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"] == []


# ---------------------------------------------------------------------- NUL characters


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/sessions", {"title": "a\x00b"}),
        ("PATCH", "/api/sessions/{sid}", {"title": "a\x00b"}),
        ("POST", "/api/sessions/{sid}/turns", {"task": "count\x00 words"}),
        (
            "POST",
            "/api/sessions/{sid}/turns",
            {"task": "t", "output_schema": {"type": "object", "description": "a\x00b"}},
        ),
    ],
    ids=["session-title", "rename", "task", "nested-value"],
)
def test_a_nul_character_is_422_on_every_store(
    client: httpx.Client, session_id: str, method: str, path: str, body: dict[str, object]
) -> None:
    """PostgreSQL's text and jsonb cannot hold U+0000 (SQLite can): one answer for both stores, before any write."""
    response = client.request(method, path.format(sid=session_id), json=body)
    error = assert_error(response, 422, "validation_error")
    assert "NUL" in error["message"]
    assert client.get(f"/api/sessions/{session_id}").json()["title"] == "test"
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"] == []
