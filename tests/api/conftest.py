"""Fixtures for the API suites: a real uvicorn server on a free loopback port over a real store on disk
(or the PostgreSQL server named by FLEET_TEST_DATABASE_URL), talking to the scripted LM."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from live_api import LiveServer

from fleet_kernel.config import Settings, load_settings


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(settings) as server:
        yield server


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


@pytest.fixture
def session_id(client: httpx.Client) -> str:
    response = client.post("/api/sessions", json={"title": "test"})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


@pytest.fixture
def token_settings(fleet_env: dict[str, str], settings: Settings) -> Settings:
    return load_settings({**fleet_env, "FLEET_API_TOKEN": "s3cret-token-for-tests-0123456789abcdef"})
