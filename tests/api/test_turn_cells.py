"""Over HTTP, a turn can replace an earlier one (``supersedes_turn_id``) and be taken out of the history
(``PATCH ... {"in_history": false}``); the turn list keeps every turn, the notebook shows what stands."""

from __future__ import annotations

import json
from typing import Any

import httpx
import nbformat
from live_api import assert_error, events_of
from scripted_lm import ScriptedLM, step


def start(client: httpx.Client, session_id: str, task: str, **body: Any) -> list[Any]:
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": task, **body}) as r:
        assert r.status_code == 200, r.read()
        return events_of(r)


def turn(lm: ScriptedLM, client: httpx.Client, session_id: str, task: str, answer: str, **body: Any) -> str:
    lm.add("*", [step("done", f"SUBMIT(answer={answer!r})")])
    frames = start(client, session_id, task, **body)
    assert frames[-1].event == "turn.completed", frames[-1].envelope
    return str(frames[0].envelope["turn_id"])


def last_history(lm: ScriptedLM) -> str:
    """The ``history`` input of the latest root-LM request (the preview of the REPL variable)."""
    text = "\n".join(str(m.get("content", "")) for m in lm.requests[-1]["messages"] if m.get("role") == "user")
    return text.split("Variable: `history`", 1)[1].split("\u00bb\u00bb\u00bb", 1)[0]


def turns(client: httpx.Client, session_id: str) -> dict[str, dict[str, Any]]:
    return {t["turn_id"]: t for t in client.get(f"/api/sessions/{session_id}/turns").json()["turns"]}


def test_a_turn_that_supersedes_another_takes_its_place(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    a = turn(scripted_lm, client, session_id, "alpha: name a fruit", "apple-one")
    b = turn(scripted_lm, client, session_id, "beta: name a colour", "blue-one")
    scripted_lm.add("*", [step("done", "SUBMIT(answer='carrot-two')")])
    frames = start(client, session_id, "alpha: name a vegetable", supersedes_turn_id=a)
    a2 = frames[0].envelope["turn_id"]
    assert frames[0].envelope["data"]["supersedes_turn_id"] == a and frames[0].envelope["data"]["cell_id"] is None

    listed = turns(client, session_id)
    assert list(listed) == [a, b, a2]  # the full log stays
    assert listed[a]["superseded_by"] == a2 and listed[a]["in_history"] is False
    assert listed[a2]["supersedes_turn_id"] == a and listed[a2]["in_history"] is True
    assert listed[b]["superseded_by"] is None and listed[b]["in_history"] is True
    one = client.get(f"/api/sessions/{session_id}/turns/{a}").json()
    assert one["superseded_by"] == a2 and one["in_history"] is False

    turn(scripted_lm, client, session_id, "gamma: what came before?", "done")
    history = last_history(scripted_lm)
    assert "apple-one" not in history and history.index("carrot-two") < history.index("blue-one")

    notebook = nbformat.reads(client.get(f"/api/sessions/{session_id}/notebook").text, as_version=4)
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    assert sources == ["alpha: name a vegetable", "beta: name a colour", "gamma: what came before?"]


def test_supersedes_turn_id_must_name_a_turn_of_the_session(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    other = client.post("/api/sessions", json={"title": "other"}).json()["session_id"]
    theirs = turn(scripted_lm, client, other, "their task", "theirs")
    for bad in (theirs, "turn_0000000000000000000"):
        response = client.post(f"/api/sessions/{session_id}/turns", json={"task": "mine", "supersedes_turn_id": bad})
        error = assert_error(response, 422, "validation_error")
        assert "is not a turn of this session" in error["message"]
    assert turns(client, session_id) == {}


def test_in_history_takes_a_turn_out_and_back(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    a = turn(scripted_lm, client, session_id, "alpha: name a fruit", "apple-one")
    b = turn(scripted_lm, client, session_id, "beta: name a colour", "blue-one")
    url = f"/api/sessions/{session_id}/turns/{a}"
    forgotten = client.patch(url, json={"in_history": False})
    assert forgotten.status_code == 200, forgotten.text
    assert forgotten.json()["in_history"] is False and forgotten.json()["turn_id"] == a
    turn(scripted_lm, client, session_id, "gamma: what came before?", "done")
    assert "apple-one" not in last_history(scripted_lm) and "blue-one" in last_history(scripted_lm)
    assert turns(client, session_id)[a]["in_history"] is False

    assert client.patch(url, json={"in_history": True}).json()["in_history"] is True
    turn(scripted_lm, client, session_id, "delta: and now?", "done again")
    assert "apple-one" in last_history(scripted_lm)

    b2 = turn(scripted_lm, client, session_id, "beta: name a shape", "square", supersedes_turn_id=b)
    error = assert_error(client.patch(f"/api/sessions/{session_id}/turns/{b}", json={"in_history": True}), 409)
    assert error["code"] == "not_restorable" and b2 in error["message"]
    assert_error(client.patch(f"/api/sessions/{session_id}/turns/turn_nope", json={"in_history": False}), 404)
    assert_error(client.patch(url, json={"in_history": "maybe"}), 422)
    assert_error(client.patch(url, json={"in_history": False, "hidden": True}), 422)
    assert json.dumps(turns(client, session_id)[b]).count(b2) == 1  # superseded_by
