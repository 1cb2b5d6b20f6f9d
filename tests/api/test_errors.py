"""The error contract at the edges: a store that goes away is a 503, no 5xx leaks a trace,
and the process keeps serving after anything a client sends."""

from __future__ import annotations

import httpx
import pytest
from live_api import LiveServer, assert_error

from fleet_kernel.store import Store

UNREACHABLE = "postgresql+asyncpg://fleet:secret-password@127.0.0.1:1/fleet"


@pytest.mark.own_server  # it takes the server's store away
def test_store_down_is_503(live: LiveServer, client: httpx.Client, session_id: str) -> None:
    state = live.app.state.fleet
    healthy = state.store
    state.store = Store(UNREACHABLE)  # a real store whose database refuses connections
    try:
        for method, path in (
            ("GET", "/api/sessions"),
            ("POST", "/api/sessions"),
            ("GET", f"/api/sessions/{session_id}"),
            ("GET", f"/api/sessions/{session_id}/turns"),
            ("PUT", "/api/runs/run_x/cancellation"),
            ("GET", "/api/artifacts/art_x"),
        ):
            error = assert_error(client.request(method, path), 503, "store_unavailable")
            assert "secret-password" not in error["message"] and "127.0.0.1" not in error["message"]
        health = client.get("/api/health")
        assert health.status_code == 503
        assert health.json()["status"] == "degraded" and health.json()["store"]["ok"] is False
    finally:
        state.store = healthy
    assert client.get(f"/api/sessions/{session_id}").status_code == 200


def test_keeps_serving_after_garbage(client: httpx.Client, session_id: str) -> None:
    garbage = [
        ("POST", "/api/sessions", {"content": b"\xff\xfe\x00", "headers": {"content-type": "application/json"}}),
        ("POST", "/api/sessions", {"content": b"[]", "headers": {"content-type": "application/json"}}),
        (
            "POST",
            "/api/sessions",
            {"content": b"title=x", "headers": {"content-type": "application/x-www-form-urlencoded"}},
        ),
        ("POST", f"/api/sessions/{session_id}/turns", {"json": {"task": 7}}),
        (
            "POST",
            f"/api/sessions/{session_id}/turns",
            {"json": {"task": "x"}, "headers": {"Idempotency-Key": b"caf\xe9"}},
        ),
        (
            "POST",
            "/api/attachments",
            {"content": b"--x\r\n", "headers": {"content-type": "multipart/form-data; boundary=x"}},
        ),
        ("GET", "/api/volume/tree", {"params": {"session_id": session_id, "depth": "-1"}}),
        ("PATCH", f"/api/sessions/{session_id}", {"json": {"title": None}}),
    ]
    for method, path, kwargs in garbage:
        response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text)
        assert_error(response, response.status_code)
    assert client.get("/api/health").status_code == 200
