"""Fixtures for the API suites: a real uvicorn server on a free loopback port over a real store on disk
(or the PostgreSQL server named by FLEET_TEST_DATABASE_URL), talking to the scripted LM.

Starting a server and its store costs most of a small test, so the tests that take the default settings share
one: each pytest worker starts a server once, on the worker's scripted LM (tests/conftest.py), over a home of its own, and hands it to every
test that asks for ``live``, ``client`` or ``session_id``; each test makes its own session and looks up its
own rows. The scripted LM is ``reset()`` before each test, so a test's scripts,
requests and settings start empty as with a fresh one.

A test that needs a server of its own (other settings, a home or working folder it changes, a server it stops,
or counts over the whole store) is marked ``@pytest.mark.own_server`` (or its module is): then ``live`` is a
fresh server over a fresh copy of the store, as ``LiveServer(settings)`` in a test is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from homes import env_for, new_home
from live_api import LiveServer
from scripted_lm import ScriptedLM

from fleet_kernel.config import Settings, load_settings


def _shares_server(request: pytest.FixtureRequest) -> bool:
    return "live" in request.fixturenames and request.node.get_closest_marker("own_server") is None


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory, migrated_store_file: Path) -> Path:
    return new_home(tmp_path_factory.mktemp("shared-api"), migrated_store_file)


@pytest.fixture
def fleet_home(request: pytest.FixtureRequest, tmp_path: Path, migrated_store_file: Path) -> Path:
    """The shared server's home for a test that uses it; otherwise a private one with a fresh copy of the store."""
    if _shares_server(request):
        return Path(request.getfixturevalue("shared_home"))
    return new_home(tmp_path, migrated_store_file)


@pytest.fixture(scope="session")
def shared_live(shared_home: Path, shared_scripted_lm: ScriptedLM) -> Iterator[LiveServer]:
    with LiveServer(load_settings(env_for(shared_home, shared_scripted_lm))) as server:
        yield server


@pytest.fixture
def live(request: pytest.FixtureRequest, settings: Settings) -> Iterator[LiveServer]:
    if _shares_server(request):
        yield request.getfixturevalue("shared_live")
        return
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
