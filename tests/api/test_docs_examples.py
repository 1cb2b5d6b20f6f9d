"""The request examples in the served OpenAPI document are requests the API accepts.

Swagger's "Try it out" (``/api/docs``) prefills the body with an operation's first example and sends it
as it stands; each example must therefore pass validation on a fresh session. The examples are taken from
the document the real server serves and sent to it over loopback, as the docs page would.
"""

from __future__ import annotations

from typing import Any

import httpx
from scripted_lm import ScriptedLM, step

METHODS = ("post", "put", "patch")


def _examples(document: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """``(method, path, example name, body)`` of every JSON request body example in the document."""
    found = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = (operation.get("requestBody") or {}).get("content", {}).get("application/json", {})
            for name, example in (content.get("examples") or {}).items():
                found.append((method, path, name, example["value"]))
    return found


def test_every_body_route_has_an_example(client: httpx.Client) -> None:
    document = client.get("/api/openapi.json").json()
    without = [
        f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if method in METHODS
        and "application/json" in (operation.get("requestBody") or {}).get("content", {})
        and not operation["requestBody"]["content"]["application/json"].get("examples")
    ]
    assert without == [], "JSON bodies Swagger would prefill from the bare schema"


def test_served_examples_are_accepted_as_they_stand(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.default = step("done", "SUBMIT(answer='42')")
    document = client.get("/api/openapi.json").json()
    examples = _examples(document)
    assert {path for _, path, _, _ in examples} >= {"/api/sessions", "/api/sessions/{session_id}/turns"}
    session_id = client.post("/api/sessions", json={}).json()["session_id"]
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": "a first turn"}) as first:
        first.read()
    turn_id = client.get(f"/api/sessions/{session_id}/turns").json()["turns"][0]["turn_id"]
    ids = {"session_id": session_id, "turn_id": turn_id, "memory_id": "mem-example"}
    for method, path, name, body in examples:
        url = path.format(**ids)
        with client.stream(method.upper(), url, json=body) as response:
            response.read()
        assert response.status_code < 400, (method, path, name, response.status_code, response.text)
