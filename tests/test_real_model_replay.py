"""Qwen2.5-Coder-1.5B-Instruct's recorded turns, replayed over the real HTTP API: what the user sees.

``scripts/real-model.sh --record tests/data`` recorded these cassettes from the model served on loopback
(``docs/real-models.md``): ``real-model-api.cassette.json`` holds the suite's API turns,
``real-model-truncated.cassette.json`` a turn under ``[lm] max_tokens = 40`` whose replies were cut at
the cap. Each header lists the turns (the request body, the files attached, how the turn ended) and the
configuration they ran under. A replay sends the same turn to a real ``fleet serve`` whose model is the
cassette, and checks the answer, the steps, the error text and the truncation notice are what the live
run showed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_api import LiveServer, iter_frames
from real_model_replays import DATA, assert_as_recorded, ending, fleet_toml, load, suite

from fleet_kernel.config import load_settings

API = load("real-model-api.cassette.json")
CUT = load("real-model-truncated.cassette.json")


def _replay(tmp_path: Path, cassette: str, header: dict[str, Any], turn: dict[str, Any]) -> list[dict[str, Any]]:
    """Send ``turn`` to a real API whose model is the cassette; the turn's envelopes."""
    (tmp_path / "fleet.toml").write_text(fleet_toml(header), encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "FLEET_HOME": str(home),
        "FLEET_CONFIG": str(tmp_path / "fleet.toml"),
        "FLEET_LM_MODEL": f"replay/{DATA / cassette}",
    }
    if os.environ.get("FLEET_TEST_DATABASE_URL"):
        env["FLEET_DATABASE_URL"] = os.environ["FLEET_TEST_DATABASE_URL"]
    tasks = suite()
    task = {t.name: t for t in tasks.tasks(tasks.make_log())}[turn["task"]]
    with LiveServer(load_settings(env)) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        session = client.post("/api/sessions", json={"title": "replayed real model"}).json()["session_id"]
        ids = []
        for name in turn["files"]:
            upload = client.post(
                "/api/attachments",
                data={"session_id": session},
                files={"file": (name, task.files[name].encode(), "text/plain")},
            )
            assert upload.status_code in (200, 201), upload.text
            ids.append(upload.json().get("attachment_id") or upload.json()["id"])
        body = dict(turn["body"], **({"attachment_ids": ids} if ids else {}))
        with client.stream("POST", f"/api/sessions/{session}/turns", json=body) as response:
            assert response.status_code == 200, response.read()
            return [frame.envelope for frame in iter_frames(response) if frame.data]


def test_the_cassettes_are_the_instruction_tuned_models_recordings() -> None:
    assert CUT["exchanges"], "no recording of a reply cut at the cap (scripts/real-model.sh --record tests/data)"
    for header in (h for h in (API, CUT) if h["exchanges"]):
        assert header["model"] == "openai/qwen2.5-coder-1.5b-instruct"
        for exchange in header["exchanges"]:  # what each request asked for, and how each reply ended
            assert {"max_tokens", "tools", "stream"} <= set(exchange["request"]), exchange.get("request")
            assert exchange["response"]["finish_reason"] in ("stop", "length")
            assert exchange["response"]["usage"]["input_tokens"] > 0
    assert any(e["response"]["finish_reason"] == "length" for e in CUT["exchanges"])
    assert all(
        e["request"]["max_tokens"] == CUT["config"]["max_tokens"]
        for e in CUT["exchanges"]
        if e["messages"][0]["content"].startswith("Your input fields are")
    )


@pytest.mark.parametrize("turn", API["turns"], ids=[t["task"] for t in API["turns"]])
def test_a_replayed_turn_shows_what_the_live_one_did(tmp_path: Path, turn: dict[str, Any]) -> None:
    assert_as_recorded(_replay(tmp_path, "real-model-api.cassette.json", API, turn), turn)


@pytest.mark.parametrize("turn", CUT["turns"], ids=[t["task"] for t in CUT["turns"]])
def test_a_reply_cut_at_max_tokens_says_so_and_names_the_key(tmp_path: Path, turn: dict[str, Any]) -> None:
    events = _replay(tmp_path, "real-model-truncated.cassette.json", CUT, turn)
    end = ending(events)
    finished = [e["data"] for e in events if e["type"] == "lm.finished"]
    assert "length" in [d.get("finish_reason") for d in finished]  # the replay ends the reply as live: cut
    assert end["type"] == turn["outcome"] == "turn.failed", end["data"]
    message = end["data"]["error"]["message"]
    assert f"cut at the completion cap ({CUT['config']['max_tokens']} tokens" in message
    assert "`[lm] max_tokens`" in message and "What the model said" in message
