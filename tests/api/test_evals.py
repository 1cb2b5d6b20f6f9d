"""``POST /api/evals``: the engine's evaluation over HTTP, each run a session the API then serves."""

from __future__ import annotations

import httpx
from live_api import assert_error
from scripted_lm import ScriptedLM, step


def test_an_eval_over_http_scores_each_run_and_keeps_its_session(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("(one)", [step("One.", "SUBMIT(answer='1')")])
    scripted_lm.add("(two)", [step("Two.", "SUBMIT(answer='three')")])
    body = {
        "tasks": [
            {"id": "one", "task": "Say 1 (one)", "expected": 1, "scorer": "numeric"},
            {"id": "two", "task": "Say two (two)", "expected": "two", "scorer": "contains"},
        ],
        "name": "smoke",
    }
    response = client.post("/api/evals", json=body, timeout=120)
    assert response.status_code == 200, response.text
    report = response.json()
    assert [(r["task_id"], r["score"]) for r in report["results"]] == [("one", 1.0), ("two", 0.0)]
    assert report["summary"][0]["mean"] == 0.5 and report["summary"][0]["passed"] == 1
    run = report["results"][1]
    session = client.get(f"/api/sessions/{run['session_id']}").json()
    assert session["title"] == "eval smoke: two · openai/scripted · #1"
    notebook = client.get(f"/api/sessions/{run['session_id']}/notebook")
    assert notebook.status_code == 200 and "three" in notebook.text


def test_a_bad_eval_is_refused_before_anything_runs(client: httpx.Client, scripted_lm: ScriptedLM) -> None:
    row = {"task": "t", "expected": "x"}
    before = client.get("/api/sessions").json()["sessions"]  # the newest first: a new one would lead
    assert_error(client.post("/api/evals", json={"tasks": []}), 422)
    assert_error(client.post("/api/evals", json={"tasks": [{"task": "t"}]}), 422)  # no expected answer
    assert_error(client.post("/api/evals", json={"tasks": [{**row, "attachments": ["/etc/passwd"]}]}), 422)
    assert_error(client.post("/api/evals", json={"tasks": [row], "name": "../up"}), 422)
    assert_error(client.post("/api/evals", json={"tasks": [row], "repeat": 0}), 422)
    assert_error(client.post("/api/evals", json={"tasks": [row], "models": ["anthropic/claude"]}), 422)
    assert_error(client.post("/api/evals", json={"tasks": [{**row, "id": "a"}, {**row, "id": "a"}]}), 422)
    many = {"tasks": [{**row, "id": str(n)} for n in range(200)], "models": ["openai/a", "openai/b"], "repeat": 3}
    assert "at most 1000" in assert_error(client.post("/api/evals", json=many), 422)["message"]
    assert client.get("/api/sessions").json()["sessions"] == before
    assert scripted_lm.requests == []
