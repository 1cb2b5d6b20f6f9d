"""Bearer-token auth: every route but /api/health and the docs needs the token once FLEET_API_TOKEN is set."""

from __future__ import annotations

import httpx
import pytest
from live_api import LiveServer, assert_error

from fleet_api.auth import is_loopback
from fleet_api.server import check_bind
from fleet_kernel.config import Settings
from fleet_kernel.errors import ConfigError

TOKEN = "s3cret-token-for-tests-0123456789abcdef"


def test_token_required(token_settings: Settings) -> None:
    with LiveServer(token_settings) as live, httpx.Client(base_url=live.url) as client:
        assert client.get("/api/health").status_code == 200
        for method, path in (
            ("GET", "/api/sessions"),
            ("POST", "/api/sessions"),
            ("GET", "/api/skills"),
            ("GET", "/api/no-such-route"),
            ("PUT", "/api/runs/run_x/cancellation"),
        ):
            error = assert_error(client.request(method, path), 401, "unauthorized")
            assert TOKEN not in error["message"]
        response = client.get("/api/sessions", headers={"Authorization": "Bearer wrong"})
        assert_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert_error(client.get("/api/sessions", headers={"Authorization": TOKEN}), 401)
        # Bad JSON from a stranger is still a 401: nothing is parsed before the token is checked.
        assert_error(client.post("/api/sessions", content=b"{", headers={"content-type": "application/json"}), 401)
        authed = {"Authorization": f"Bearer {TOKEN}"}
        assert client.get("/api/sessions", headers=authed).status_code == 200
        assert client.post("/api/sessions", headers=authed).status_code == 201
        assert client.get("/api/sessions", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_no_token_on_loopback_is_open(client: httpx.Client) -> None:
    assert client.get("/api/sessions").status_code == 200


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("::", False),
        ("example.org", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_non_loopback_bind_needs_token(settings: Settings, token_settings: Settings) -> None:
    with pytest.raises(ConfigError, match="FLEET_API_TOKEN"):
        check_bind("0.0.0.0", settings)
    check_bind("0.0.0.0", token_settings)
    check_bind("127.0.0.1", settings)
