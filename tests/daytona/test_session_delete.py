"""Deleting a Fleet session deletes its Daytona sandbox, wherever it was created; other sandboxes stay."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from fake_server import FakeDaytona
from live_api import LiveServer, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox import daytona
from fleet_kernel.workspace import Workspace

LOGGER = "fleet_kernel.engine.sessions"  # where deleting a session says what it could not clean up


def _sessions(client: Any, store: str) -> list[str]:
    """The ``fleet_session`` label of every sandbox of this store, as Daytona lists them."""
    query = daytona.sdk.ListSandboxesQuery(labels={"fleet_store": store})
    return sorted(sandbox.labels["fleet_session"] for sandbox in client.list(query))


def _acquire(settings: Settings, session_id: str) -> str:
    return daytona.acquire(settings, Workspace.for_session(settings.workspaces_dir, session_id).root).id


def test_a_sessions_sandbox_is_deleted_and_others_stay(settings: Settings, client: Any, fake: FakeDaytona) -> None:
    factory = daytona.open_daytona(settings, Workspace.for_session(settings.workspaces_dir, "session-a").root)
    factory().execute("print('a turn ran here')")
    factory.close()
    kept = _acquire(settings, "session-b")
    foreign = client.create(
        daytona.sdk.CreateSandboxFromSnapshotParams(
            language="python", labels={"fleet_store": "another-store", "fleet_session": "session-a"}
        )
    )
    store = daytona.store_label(settings)
    assert _sessions(client, store) == ["session-a", "session-b"]

    assert daytona.delete_session_sandboxes(settings, "session-a") == 1

    assert _sessions(client, store) == ["session-b"]
    assert set(fake.sandboxes) == {kept, foreign.id}  # another store's sandbox is not this store's to delete
    assert [box.session_id for box in daytona._boxes.values() if box.api_url == fake.api_url] == ["session-b"]
    assert daytona.delete_session_sandboxes(settings, "session-a") == 0  # idempotent


def test_sandboxes_another_process_created_are_found_by_label(
    settings: Settings, client: Any, fake: FakeDaytona, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = daytona.store_label(settings)
    _acquire(settings, "ses_shared")
    monkeypatch.setattr(daytona, "_boxes", {})  # as if that process were another one: nothing cached here
    stopped = client.create(
        daytona.sdk.CreateSandboxFromSnapshotParams(
            language="python", labels={"fleet": "1", "fleet_store": store, "fleet_session": "ses_shared"}
        )
    )
    stopped.stop()
    other = _acquire(settings, "ses_other")

    assert daytona.delete_session_sandboxes(settings, "ses_shared") == 2

    assert _sessions(client, store) == ["ses_other"] and list(fake.sandboxes) == [other]


def test_daytona_failures_are_explained(settings: Settings, fake: FakeDaytona) -> None:
    _acquire(settings, "session-a")
    fake.fail("GET", "/api/sandbox", 500, "down", times=10)
    with pytest.raises(SandboxUnavailableError, match="Daytona is failing"):
        daytona.delete_session_sandboxes(settings, "session-a")


def test_http_delete_deletes_the_sandbox_its_turn_ran_in(
    settings: Settings, client: Any, fake: FakeDaytona, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("*", [step("Answer.", "print('in daytona')\nSUBMIT(answer='done')")])
    store = daytona.store_label(settings)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        sid = http.post("/api/sessions", json={"title": "doomed"}).json()["session_id"]
        frames = run_turn(http, sid, "run on daytona")
        assert frames[0].envelope["data"]["sandbox"] == "daytona" and frames[-1].event == "turn.completed"
        kept = http.post("/api/sessions", json={"title": "kept"}).json()["session_id"]
        _acquire(settings, kept)
        assert _sessions(client, store) == sorted([sid, kept])

        assert http.delete(f"/api/sessions/{sid}").status_code == 204

        assert _sessions(client, store) == [kept]
        assert http.get(f"/api/sessions/{kept}").status_code == 200


def test_http_delete_succeeds_when_daytona_is_unreachable(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    offline = load_settings({**env, "FLEET_DAYTONA_API_URL": "http://127.0.0.1:9/api"})
    with LiveServer(offline) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        sid = http.post("/api/sessions").json()["session_id"]
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert http.delete(f"/api/sessions/{sid}").status_code == 204
        assert http.get(f"/api/sessions/{sid}").status_code == 404
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert any(
        f"could not delete the sandbox of session {sid}" in w and "cannot reach Daytona" in w for w in warnings
    ), warnings
