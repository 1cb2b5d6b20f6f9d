"""What a turn is given over HTTP: skills (catalogue, tools, preselection), this turn's files, a typed
result and per-turn limits, through the real server, the real sandbox and the scripted LM."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_api import Frame, assert_error, events_of
from scripted_lm import ScriptedLM, step

from fleet_kernel.skills import trust_project

CARD = """---
name: ship-facts
description: Answer questions about the fleet's ships from the harbour register.
---
# Ship facts

Read `data/ports.txt` with read_skill_resource before you answer.
"""


def start(client: httpx.Client, session_id: str, task: str, **body: Any) -> list[Frame]:
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json={"task": task, **body}) as r:
        assert r.status_code == 200, r.read()
        return events_of(r)


def data(frames: list[Frame], type_: str) -> list[dict[str, Any]]:
    return [f.envelope["data"] for f in frames if f.event == type_]


def printed(frames: list[Frame]) -> str:
    return "".join(d["text"] for d in data(frames, "output"))


def prompts(lm: ScriptedLM, needle: str) -> list[str]:
    """The text of every root-model request whose messages contain ``needle``."""
    texts = ["\n".join(str(m.get("content", "")) for m in body.get("messages") or []) for body in lm.requests]
    return [t for t in texts if needle in t]


@pytest.fixture
def project_skill(tmp_path: Path, fleet_home: Path) -> Path:
    """A card in ./.fleet/skills of the server's working directory, with a resource, a link and a secret;
    the folder is trusted (``%fleet skill trust``: the trust kept in FLEET_HOME, which the server reads)."""
    folder = tmp_path / ".fleet" / "skills" / "ship-facts"
    (folder / "data").mkdir(parents=True)
    (folder / "SKILL.md").write_text(CARD)
    (folder / "data" / "ports.txt").write_text("Kestrel: Bergen\nOsprey: Lisbon\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("the launch code is 0000-PLUTO\n")
    os.symlink(secret, folder / "data" / "leak.txt")
    trust_project(fleet_home, tmp_path)
    return folder


@pytest.mark.own_server  # it writes cards into the home
def test_skills_listed_with_source_and_resources(client: httpx.Client, project_skill: Path, fleet_home: Path) -> None:
    home_card = fleet_home / "skills" / "tabular-analysis"
    home_card.mkdir(parents=True)
    (home_card / "SKILL.md").write_text("---\nname: tabular-analysis\ndescription: my own tables\n---\n# Mine\n")
    skills = {s["name"]: s for s in client.get("/api/skills").json()["skills"]}
    assert skills["ship-facts"]["source"] == "project"
    assert skills["ship-facts"]["resources"] == ["data/ports.txt"]  # the link is not listed
    assert skills["tabular-analysis"]["source"] == "home"  # a home card replaces the bundled one, reported
    (warning,) = client.get("/api/skills").json()["warnings"]
    assert str(home_card) in warning and "replaces the bundled card" in warning
    assert skills["long-context-search"]["source"] == "bundled"
    one = client.get("/api/skills/ship-facts").json()
    assert one["body"].startswith("# Ship facts") and one["description"].startswith("Answer questions")
    assert_error(client.get("/api/skills/no-such-skill"), 404, "not_found")


@pytest.mark.own_server  # it writes cards into the home
def test_a_malformed_card_is_skipped_with_a_warning_naming_its_file(
    client: httpx.Client, tmp_path: Path, fleet_home: Path
) -> None:
    folder = fleet_home / "skills" / "broken"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: broken\n---\nno description\n")
    body = client.get("/api/skills").json()
    assert "broken" not in {s["name"] for s in body["skills"]} and "tabular-analysis" in str(body["skills"])
    (warning,) = body["warnings"]
    assert str(folder / "SKILL.md") in warning and "description" in warning
    untrusted = tmp_path / ".fleet" / "skills" / "ship-facts"
    untrusted.mkdir(parents=True)
    (untrusted / "SKILL.md").write_text(CARD)
    body = client.get("/api/skills").json()
    assert "ship-facts" not in {s["name"] for s in body["skills"]}
    assert any("not trusted" in w and str(untrusted.parent) in w for w in body["warnings"]), body["warnings"]


def test_code_loads_a_skill_and_reads_a_resource(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, project_skill: Path
) -> None:
    escapes = (
        "for path in ['../../secret.txt', 'data/leak.txt', '/etc/passwd', '../SKILL.md']:\n"
        "    try:\n        print(read_skill_resource('ship-facts', path))\n"
        "    except Exception as exc:\n        print('refused:', type(exc).__name__, exc)"
    )
    scripted_lm.add("Kestrel", [
        step("Load the card.", "print(load_skill('ship-facts'))\nprint(read_skill_resource('ship-facts', 'data/ports.txt'))"),
        step("Try to leave the folder.", escapes),
        step("Answer.", "SUBMIT(answer='Kestrel is in Bergen.')"),
    ])  # fmt: skip
    frames = start(client, session_id, "Where is the Kestrel?")
    assert frames[-1].event == "turn.completed", frames[-1].data
    out = printed(frames)
    assert "Read `data/ports.txt` with read_skill_resource" in out and "Kestrel: Bergen" in out
    assert out.count("refused:") == 4 and "PLUTO" not in json.dumps([f.envelope for f in frames])
    started = {d["call_id"]: d["name"] for d in data(frames, "tool.started")}
    finished = {d["call_id"]: d["ok"] for d in data(frames, "tool.finished")}
    assert sorted(started.values()) == ["load_skill"] + ["read_skill_resource"] * 5
    assert [finished[c] for c, n in started.items() if n == "load_skill"] == [True]
    assert sum(finished.values()) == 2  # the card and the one real resource
    # The catalogue is in the prompt of every step: names and descriptions, not the bodies.
    (first, *_) = prompts(scripted_lm, "Where is the Kestrel?")
    assert "- ship-facts: Answer questions about the fleet's" in first and "load_skill" in first
    assert "- tabular-analysis: " in first and "Read `data/ports.txt`" not in first


def test_preselected_skills_are_in_the_prompt(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, project_skill: Path
) -> None:
    scripted_lm.add("preselect", [step("done", "SUBMIT(answer='ok')")])
    frames = start(client, session_id, "preselect two skills", skills=["ship-facts", "tabular-analysis"])
    assert frames[-1].event == "turn.completed"
    assert data(frames, "turn.started")[0]["skills"] == ["ship-facts", "tabular-analysis"]
    (prompt,) = prompts(scripted_lm, "preselect two skills")
    assert "Read `data/ports.txt` with read_skill_resource" in prompt and "Load with explicit types" in prompt
    scripted_lm.add("plain", [step("done", "SUBMIT(answer='ok')")])
    frames = start(client, session_id, "a plain turn")
    assert data(frames, "turn.started")[0]["skills"] == []
    (prompt,) = prompts(scripted_lm, "a plain turn")
    assert "Load with explicit types" not in prompt


def upload(client: httpx.Client, session_id: str, name: str, content: bytes) -> dict[str, Any]:
    response = client.post("/api/attachments", files={"file": (name, content)}, data={"session_id": session_id})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_turn_with_two_attachments(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    sales = upload(client, session_id, "sales.csv", b"month,total\njan,3\n")
    notes = upload(client, session_id, "notes.txt", b"ship early\n")
    # An earlier turn writes another file where sales.csv was and removes notes.txt.
    scripted_lm.add(
        "reshape",
        [
            step(
                "change files",
                (
                    "open('/workspace/files/sales.csv', 'w').write('mine, not the upload\\n')\n"
                    "import os\nos.remove('/workspace/files/notes.txt')\nSUBMIT(answer='changed')"
                ),
            )
        ],
    )
    assert start(client, session_id, "reshape the files")[-1].event == "turn.completed"
    read = "import os\nfor n in sorted(os.listdir('/workspace/files')):\n    print(n, '=', open('/workspace/files/' + n).read().strip())"
    scripted_lm.add("both files", [step("read them", read), step("done", "SUBMIT(answer='read')")])
    frames = start(
        client, session_id, "sum both files", attachment_ids=[sales["attachment_id"], notes["attachment_id"]]
    )
    assert frames[-1].event == "turn.completed", frames[-1].data
    attached = data(frames, "turn.started")[0]["attachments"]
    assert [a["attachment_id"] for a in attached] == [sales["attachment_id"], notes["attachment_id"]]
    assert attached[0] | {} == {
        "attachment_id": sales["attachment_id"],
        "name": "sales-2.csv",
        "path": "files/sales-2.csv",
        "size": 18,
        "sha256": sales["sha256"],
        "renamed": True,
    }
    assert attached[1]["name"] == "notes.txt" and not attached[1]["renamed"]  # restored where it was
    out = printed(frames)
    assert "sales.csv = mine, not the upload" in out  # never overwritten
    assert "sales-2.csv = month,total\njan,3" in out and "notes.txt = ship early" in out
    prompt = prompts(scripted_lm, "sum both files")[0]
    assert "Files attached to this turn" in prompt and "/workspace/files/sales-2.csv (18 bytes)" in prompt
    assert "/workspace/files/notes.txt (11 bytes)" in prompt and "now a different file" in prompt


SCHEMA = {
    "type": "object",
    "properties": {"total": {"type": "integer"}, "ports": {"type": "array", "items": {"type": "string"}}},
    "required": ["total", "ports"],
    "additionalProperties": False,
}


def test_a_typed_result_after_one_that_does_not_validate(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("count the ports", [
        step("Submit.", "SUBMIT(answer='Two ports.', result={'total': 'two', 'ports': ['Bergen']})"),
        step("Fix it.", "SUBMIT(answer='Two ports.', result={'total': 2, 'ports': ['Bergen', 'Lisbon']})"),
    ])  # fmt: skip
    frames = start(client, session_id, "count the ports", output_schema=SCHEMA, limits={"max_iters": 4})
    assert frames[-1].event == "turn.completed", frames[-1].data
    done = frames[-1].envelope["data"]
    assert done["result"] == {"total": 2, "ports": ["Bergen", "Lisbon"]} and done["answer"] == "Two ports."
    turn = client.get(f"/api/sessions/{session_id}/turns/{frames[0].envelope['turn_id']}").json()
    assert turn["result"] == done["result"] and turn["answer"] == "Two ports."
    first, second = prompts(scripted_lm, "count the ports")
    assert '"required": ["total", "ports"]' in first  # the schema is in the prompt
    assert "result['total']: 'two' is not of type 'integer'" in second  # the model saw what to fix
    assert data(frames, "turn.started")[0]["limits"]["max_iters"] == 4


def test_a_turn_without_a_schema_has_no_result(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("untyped", [step("done", "SUBMIT(answer='plain')")])
    frames = start(client, session_id, "untyped turn")
    assert frames[-1].envelope["data"]["result"] is None
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"][0]["result"] is None


def test_per_turn_limits_are_in_turn_started(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("limited", [step("done", "SUBMIT(answer='ok')")])
    limits = {"max_iters": 3, "max_llm_calls": 5, "timeout_s": 120, "max_turn_tokens": 50_000, "max_turn_cost_usd": 0.5}
    frames = start(client, session_id, "limited turn", limits=limits)
    shown = data(frames, "turn.started")[0]["limits"]
    assert {k: shown[k] for k in limits} == limits
    assert frames[-1].event == "turn.completed"


def test_bad_choices_are_422(client: httpx.Client, session_id: str, project_skill: Path) -> None:
    def post(**body: Any) -> dict[str, Any]:
        response = client.post(f"/api/sessions/{session_id}/turns", json={"task": "t", **body})
        return assert_error(response, 422)

    assert "unknown skill 'nope'" in post(skills=["nope"])["message"]
    post(skills=["ship-facts", "tabular-analysis", "long-context-search", "child-rlm-delegation", "x"])
    assert "not an attachment of session" in post(attachment_ids=["att_missing"])["message"]
    other = client.post("/api/sessions").json()["session_id"]
    foreign = upload(client, other, "x.txt", b"x")
    assert "not an attachment of session" in post(attachment_ids=[foreign["attachment_id"]])["message"]
    assert "describe an object" in post(output_schema={"type": "string"})["message"]
    assert "'$ref'" in post(output_schema={"type": "object", "properties": {"a": {"$ref": "http://x/s"}}})["message"]
    assert "'pattern'" in post(output_schema={"type": "object", "properties": {"a": {"pattern": "(a+)+$"}}})["message"]
    assert "not a valid JSON Schema" in post(output_schema={"type": "object", "required": "a"})["message"]
    assert "at most 20" in post(limits={"max_iters": 21})["message"]  # the policy's max_iters is 20
    post(limits={"max_depth": 1})  # not a per-turn limit
    post(limits={"timeout_s": 0})
    assert client.get(f"/api/sessions/{session_id}/turns").json()["turns"] == []  # nothing was started
    assert_error(client.post("/api/sessions/ses_missing/turns", json={"task": "t", "attachment_ids": ["a"]}), 404)


TABLE_SCHEMA = {
    "type": "object",
    "properties": {"table": {"type": "string", "format": "artifact"}, "rows": {"type": "integer"}},
    "required": ["table", "rows"],
}
SAVE_TABLE = "open('/workspace/artifacts/table.csv', 'w').write('port,ships\\nBergen,3\\nLisbon,5\\nOslo,1\\n')"


def test_a_typed_result_references_an_artifact(client: httpx.Client, session_id: str, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("tabulate the ports", [
        step("Submit a path outside artifacts/.", "SUBMIT(answer='Saved.', result={'table': 'table.csv', 'rows': 3})"),
        step("Save the table.", SAVE_TABLE),
        step("Submit its path.", "SUBMIT(answer='Saved.', result={'table': 'artifacts/table.csv', 'rows': 3})"),
    ])  # fmt: skip
    frames = start(client, session_id, "tabulate the ports", output_schema=TABLE_SCHEMA)
    assert frames[-1].event == "turn.completed", frames[-1].data
    result = frames[-1].envelope["data"]["result"]
    (saved,) = data(frames, "artifact")
    assert result["rows"] == 3
    assert result["table"] == {**{k: saved[k] for k in ("artifact_id", "path", "mime", "size", "sha256")},
                               "url": f"/api/artifacts/{saved['artifact_id']}/content"}  # fmt: skip
    assert result["table"]["path"] == "artifacts/table.csv"
    assert client.get(result["table"]["url"]).text == "port,ships\nBergen,3\nLisbon,5\nOslo,1\n"
    turn = client.get(f"/api/sessions/{session_id}/turns/{frames[0].envelope['turn_id']}").json()
    assert turn["result"] == result
    first, second, *_ = prompts(scripted_lm, "tabulate the ports")
    assert '"format": "artifact"' in first and "save it under /workspace/artifacts/" in first  # told the convention
    assert "result['table']: 'table.csv' is not a file under artifacts/" in second  # and what to fix


def test_a_result_naming_no_artifact_fails_readably(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("tabulate nothing", [
        step("Submit a file never saved.", "SUBMIT(answer='Saved.', result={'table': 'artifacts/none.csv', 'rows': 0})"),
    ])  # fmt: skip
    frames = start(client, session_id, "tabulate nothing", output_schema=TABLE_SCHEMA)
    assert frames[-1].event == "turn.failed", frames[-1].data
    error = frames[-1].envelope["data"]["error"]
    assert error["type"] == "result_artifact_missing"
    assert "result['table']: 'artifacts/none.csv'" in error["message"]
    assert "saved (new or changed) under /workspace/artifacts/" in error["message"]
    turn = client.get(f"/api/sessions/{session_id}/turns/{frames[0].envelope['turn_id']}").json()
    assert turn["status"] == "failed" and turn["result"] is None
