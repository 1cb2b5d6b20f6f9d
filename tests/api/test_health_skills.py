"""Health, skill cards and the committed OpenAPI document."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from live_api import assert_error

from fleet_api.openapi import render
from fleet_api.routes.health import without_paths
from fleet_kernel import __version__
from fleet_kernel.config import Settings
from fleet_kernel.sandbox import status as sandbox_status

ROOT = Path(__file__).resolve().parents[2]


def test_health(client: httpx.Client, settings: Settings) -> None:
    """The sandbox is probed in the background at start-up; health reports that probe's answer once it is in."""
    deadline = time.monotonic() + 60  # a liveness bound: the probe starts one short process
    body = client.get("/api/health").json()
    while body["sandbox"]["detail"].startswith("checking") and time.monotonic() < deadline:
        time.sleep(0.1)
        body = client.get("/api/health").json()
    expected = sandbox_status(settings)
    assert body["sandbox"] == {"ok": expected.ok, "detail": without_paths(expected.detail)}, "the probe never finished"
    assert body["version"] == __version__
    assert body["store"]["ok"] is True
    assert body["status"] == ("ok" if expected.ok else "degraded")


def test_skills(client: httpx.Client) -> None:
    skills = client.get("/api/skills").json()["skills"]
    names = {s["name"] for s in skills}
    assert {"long-context-search", "tabular-analysis", "child-rlm-delegation"} <= names
    for skill in skills:
        assert skill["description"] and skill["body"].startswith("# ")
    one = client.get("/api/skills/tabular-analysis").json()
    assert one["name"] == "tabular-analysis" and "pandas" in one["body"]
    assert_error(client.get("/api/skills/nope"), 404, "not_found")


def test_openapi_is_committed_and_current() -> None:
    committed = json.loads((ROOT / "openapi.json").read_text())
    assert committed == json.loads(render()), "openapi.json drifted: run `python -m fleet_api.openapi openapi.json`"


def test_openapi_served(client: httpx.Client) -> None:
    served = client.get("/api/openapi.json").json()
    assert served == json.loads(render())
    paths = served["paths"]
    for path in (
        "/api/health",
        "/api/sessions",
        "/api/sessions/{session_id}",
        "/api/sessions/{session_id}/turns",
        "/api/sessions/{session_id}/turns/{turn_id}",
        "/api/sessions/{session_id}/turns/{turn_id}/events",
        "/api/runs/{run_id}/cancellation",
        "/api/sessions/{session_id}/notebook",
        "/api/attachments",
        "/api/attachments/{attachment_id}",
        "/api/artifacts/{artifact_id}",
        "/api/artifacts/{artifact_id}/content",
        "/api/volume/tree",
        "/api/skills",
    ):
        assert path in paths, path
    assert "text/event-stream" in paths["/api/sessions/{session_id}/turns"]["post"]["responses"]["200"]["content"]
