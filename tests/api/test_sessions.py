"""Sessions over HTTP: create, list, read, rename, delete, and their error bodies."""

from __future__ import annotations

import httpx
from live_api import assert_error


def test_create_read_list_rename(client: httpx.Client) -> None:
    created = client.post("/api/sessions", json={"title": "sales"}).json()
    assert set(created) == {
        "session_id",
        "title",
        "created_at",
        "updated_at",
        "turn_count",
        "archived",
        "model",
        "sub_model",
    }
    assert created["title"] == "sales" and created["turn_count"] == 0
    sid = created["session_id"]
    assert client.get(f"/api/sessions/{sid}").json() == created
    assert sid in [s["session_id"] for s in client.get("/api/sessions").json()["sessions"]]
    renamed = client.patch(f"/api/sessions/{sid}", json={"title": "q3 sales"}).json()
    assert renamed["title"] == "q3 sales" and renamed["updated_at"] >= created["updated_at"]


def test_create_without_body(client: httpx.Client) -> None:
    response = client.post("/api/sessions")
    assert response.status_code == 201 and response.json()["title"] == ""


def test_delete(client: httpx.Client, session_id: str) -> None:
    assert client.delete(f"/api/sessions/{session_id}").status_code == 204
    assert_error(client.get(f"/api/sessions/{session_id}"), 404, "not_found")
    assert_error(client.delete(f"/api/sessions/{session_id}"), 404, "not_found")


def test_unknown_and_malformed_ids_are_404(client: httpx.Client) -> None:
    for sid in ("ses_00000000000000000000", "no such id", "x" * 300, "..%2F..%2Fetc"):
        assert_error(client.get(f"/api/sessions/{sid}"), 404)
        assert_error(client.get(f"/api/sessions/{sid}/turns"), 404)
    assert_error(client.patch("/api/sessions/ses_missing", json={"title": "x"}), 404)


def test_validation_errors(client: httpx.Client, session_id: str) -> None:
    error = assert_error(client.post("/api/sessions", json={"titel": "typo"}), 422, "validation_error")
    assert "titel" in error["message"]
    assert_error(client.post("/api/sessions", json={"title": "x" * 201}), 422, "validation_error")
    assert_error(client.patch(f"/api/sessions/{session_id}", json={}), 422, "validation_error")
    bad_json = client.post("/api/sessions", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(bad_json, 422, "invalid_json")
    assert_error(client.get("/api/sessions", params={"limit": "lots"}), 422, "validation_error")


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_error(client.get("/api/nothing-here"), 404, "not_found")
    assert_error(client.put("/api/sessions"), 405, "method_not_allowed")
