"""A web page the user visits must not drive the loopback API: a rebound DNS name (foreign ``Host``),
cross-site "simple" requests (forms, ``no-cors`` fetches), and slow clients holding sockets open."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from live_api import LiveServer, assert_error
from ports import free_port

from fleet_api.server import HEADER_TIMEOUT_S
from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import ConfigError
from fleet_kernel.kernel.sidecar import spawn_sidecar

EVIL = "rebind.evil.example"
TOKEN = "s3cret-token-for-tests-0123456789abcdef"


def sessions(client: httpx.Client) -> list[str]:
    return [s["session_id"] for s in client.get("/api/sessions").json()["sessions"]]


def upload(client: httpx.Client, session_id: str, **headers: str) -> httpx.Response:
    files = {"file": ("evil.txt", b"planted", "text/plain")}
    return client.post("/api/attachments", data={"session_id": session_id}, files=files, headers=headers)


def workspace_files(client: httpx.Client, session_id: str) -> list[str]:
    tree = client.get("/api/volume/tree", params={"session_id": session_id, "depth": 3}).json()
    return [e["path"] for e in tree["entries"]]


# ---------------------------------------------------------------------- DNS rebinding: the Host header


def test_rebound_name_reaches_no_route(client: httpx.Client, session_id: str) -> None:
    before = set(sessions(client))  # the store may be shared with other tests (PostgreSQL)
    attachment = upload(client, session_id).json()["attachment_id"]
    evil = {"Host": f"{EVIL}:{client.base_url.port}"}
    attempts = [
        ("GET", "/api/sessions", None),
        ("GET", f"/api/attachments/{attachment}/content", None),
        ("GET", "/api/artifacts/art_0123456789abcdef0123/content", None),
        ("POST", f"/api/sessions/{session_id}/turns", {"task": "exfiltrate"}),
        ("POST", "/api/sessions", {"title": "planted"}),
        ("GET", "/api/health", None),
        ("GET", "/api/no-such-route", None),
    ]
    for method, path, body in attempts:
        error = assert_error(client.request(method, path, json=body, headers=evil), 421, "host_not_allowed")
        assert EVIL in error["message"] and "FLEET_ALLOWED_HOSTS" in error["message"]
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"] == []
    assert set(sessions(client)) == before


def test_own_names_are_answered(client: httpx.Client) -> None:
    port = client.base_url.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LocalHost:{port}", "[::1]", f"[::1]:{port}"):
        assert client.get("/api/sessions", headers={"Host": host}).status_code == 200, host
    for host in (EVIL, f"{EVIL}:{port}", "localhost.evil.example", "127.0.0.1.nip.io", "evil.localhost", "::1"):
        assert_error(client.get("/api/sessions", headers={"Host": host}), 421, "host_not_allowed")


def test_configured_names_are_answered(fleet_env: dict[str, str], settings: Settings) -> None:
    configured = load_settings({**fleet_env, "FLEET_ALLOWED_HOSTS": "fleet.example.com, Notebook.Example.org"})
    with LiveServer(configured) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        for host in ("fleet.example.com", "fleet.example.com:443", "notebook.example.org", "localhost"):
            assert client.get("/api/sessions", headers={"Host": host}).status_code == 200, host
        assert_error(client.get("/api/sessions", headers={"Host": EVIL}), 421, "host_not_allowed")


def test_bad_allowed_hosts_setting_says_what_to_write(fleet_env: dict[str, str]) -> None:
    for value in ("https://fleet.example.com", "fleet.example.com/api", "fleet.example.com:8443", "a b"):
        with pytest.raises(ConfigError, match="FLEET_ALLOWED_HOSTS"):
            load_settings({**fleet_env, "FLEET_ALLOWED_HOSTS": value})


@pytest.mark.slow
def test_fleet_serve_reads_allowed_hosts(fleet_env: dict[str, str]) -> None:
    port = free_port()
    process = spawn_sidecar(port, env={**fleet_env, "FLEET_ALLOWED_HOSTS": "fleet.example.com"})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert client.get("/api/health", headers={"Host": "fleet.example.com"}).status_code == 200
            assert_error(client.get("/api/health", headers={"Host": EVIL}), 421, "host_not_allowed")
    finally:
        process.terminate()
        process.wait(20)


def _outside_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the kernel only picks a route
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.mark.slow
def test_wildcard_bind_answers_the_address_it_was_reached_on(fleet_env: dict[str, str]) -> None:
    port = free_port()
    process = spawn_sidecar(port, host="0.0.0.0", env={**fleet_env, "FLEET_API_TOKEN": TOKEN})
    authed = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=authed, timeout=30) as client:
            assert client.get("/api/sessions").status_code == 200
            assert client.get("/api/sessions", headers={"Host": "localhost"}).status_code == 200
            assert_error(client.get("/api/sessions", headers={"Host": EVIL}), 421, "host_not_allowed")
        outside = _outside_address()
        if outside is not None:
            with httpx.Client(base_url=f"http://{outside}:{port}", headers=authed, timeout=30) as client:
                assert client.get("/api/sessions").status_code == 200
                # reached from outside, the loopback names are not this server's
                assert_error(client.get("/api/sessions", headers={"Host": "localhost"}), 421, "host_not_allowed")
    finally:
        process.terminate()
        process.wait(20)


# ---------------------------------------------------------------------- cross-site requests


def test_empty_cross_site_form_creates_no_session(client: httpx.Client) -> None:
    before = set(sessions(client))
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    cross_site = {**form, "Origin": "http://evil.example"}
    error = assert_error(client.post("/api/sessions", content=b"", headers=cross_site), 403)
    assert error["code"] == "cross_origin_refused" and "evil.example" in error["message"]
    # no Origin at all (an old browser, a privacy extension): the content type alone refuses it
    assert_error(client.post("/api/sessions", content=b"", headers=form), 415, "unsupported_media_type")
    assert set(sessions(client)) == before


def test_simple_content_types_start_no_turn(client: httpx.Client, session_id: str) -> None:
    before = set(sessions(client))
    url = f"/api/sessions/{session_id}/turns"
    body = b'{"task": "exfiltrate"}'
    simple = ({"Content-Type": "text/plain;charset=UTF-8"}, {}, {"Content-Type": "multipart/form-data; boundary=x"})
    for headers in simple:
        error = assert_error(client.post(url, content=body, headers=headers), 415, "unsupported_media_type")
        assert "application/json" in error["message"]
    assert_error(client.post("/api/sessions", content=b'{"title": "x"}'), 415, "unsupported_media_type")
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"] == []
    assert set(sessions(client)) == before


def test_cross_site_upload_is_refused(client: httpx.Client, session_id: str) -> None:
    port = client.base_url.port
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://localhost:{port + 1}"},  # another local page: same site, other origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        assert_error(upload(client, session_id, **headers), 403, "cross_origin_refused")
    assert not any("evil" in path for path in workspace_files(client, session_id))
    urlencoded = client.post("/api/attachments", data={"session_id": session_id})
    assert_error(urlencoded, 415, "unsupported_media_type")


def test_same_origin_and_plain_clients_still_work(client: httpx.Client, session_id: str) -> None:
    own = f"http://127.0.0.1:{client.base_url.port}"
    for headers in ({}, {"Origin": own}, {"Sec-Fetch-Site": "same-origin", "Origin": own}, {"Sec-Fetch-Site": "none"}):
        assert upload(client, session_id, **headers).status_code == 201, headers
        assert client.post("/api/sessions", json={"title": "ok"}, headers=headers).status_code == 201, headers
    assert client.post("/api/sessions").status_code == 201  # no body at all
    charset = {"Content-Type": "application/json; charset=utf-8"}
    created = client.post("/api/sessions", json={"title": "x"}, headers=charset)
    assert created.status_code == 201
    assert client.delete(f"/api/sessions/{created.json()['session_id']}", headers={"Origin": own}).status_code == 204


def test_foreign_origin_cannot_cancel_or_delete(client: httpx.Client, session_id: str) -> None:
    foreign = {"Origin": "http://evil.example"}
    assert_error(client.delete(f"/api/sessions/{session_id}", headers=foreign), 403, "cross_origin_refused")
    assert_error(client.put("/api/runs/run_nope/cancellation", headers=foreign), 403, "cross_origin_refused")
    assert_error(client.patch(f"/api/sessions/{session_id}", json={"title": "x"}, headers=foreign), 403)
    assert session_id in sessions(client)
    # reading is not a state change; the browser still keeps the answer from the page (no CORS headers)
    read = client.get("/api/sessions", headers=foreign)
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
    preflight = client.options("/api/sessions", headers={**foreign, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers


def test_configured_name_is_a_same_origin(fleet_env: dict[str, str], settings: Settings) -> None:
    configured = load_settings({**fleet_env, "FLEET_ALLOWED_HOSTS": "fleet.example.com"})
    with LiveServer(configured) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        behind_proxy = {"Origin": "https://fleet.example.com"}  # the proxy rewrote Host to 127.0.0.1
        assert client.post("/api/sessions", json={}, headers=behind_proxy).status_code == 201
        assert_error(client.post("/api/sessions", json={}, headers={"Origin": "https://evil.example"}), 403)


# ---------------------------------------------------------------------- slow clients


def _open_slow(port: int, count: int, partial: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(partial)
        socks.append(s)
    return socks


def _wait_closed(socks: list[socket.socket], within_s: float) -> list[socket.socket]:
    """Wait until the server closes each socket; returns those still open after ``within_s``."""
    selector = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
    open_ = set(socks)
    deadline = time.monotonic() + within_s
    while open_ and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                selector.unregister(sock)
                open_.discard(sock)
    selector.close()
    return list(open_)


@pytest.fixture
def slow_sockets() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


@pytest.mark.slow
def test_half_sent_headers_time_out(live: LiveServer, client: httpx.Client, slow_sockets: list[socket.socket]) -> None:
    partial = b"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    slow_sockets += _open_slow(live.port, 290, partial)
    slow_sockets += _open_slow(live.port, 10, b"GET /api/sess")
    # one kept-alive connection that answers once, then starts a request it never finishes
    kept = socket.create_connection(("127.0.0.1", live.port), timeout=10)
    slow_sockets.append(kept)
    kept.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    kept.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.")

    with httpx.Client(base_url=live.url, timeout=10) as fresh:
        assert fresh.get("/api/health").status_code == 200
    assert client.get("/api/sessions").status_code == 200
    still_open = _wait_closed(slow_sockets, within_s=HEADER_TIMEOUT_S * 4)
    assert still_open == [], f"{len(still_open)} of {len(slow_sockets)} half-sent requests are still held"
    assert client.get("/api/health").status_code == 200


def test_connections_are_capped(settings: Settings, slow_sockets: list[socket.socket]) -> None:
    with LiveServer(settings, max_connections=20, header_timeout_s=600) as live:
        slow_sockets += _open_slow(live.port, 20, b"GET /api/health HTTP/1.1\r\n")
        # the 21st connection is served: the half-sent request that waited longest is closed to make room
        assert httpx.get(f"{live.url}/api/health", timeout=30).status_code == 200
        slow_sockets[0].settimeout(30)
        assert slow_sockets[0].recv(1) == b"", "no half-sent request gave way to the new connection"
