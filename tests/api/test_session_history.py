"""``GET /api/sessions/{id}/history``: what the next turn sees, the sub-model's summary of the turns past the
window and the latest turns whole (fleet_kernel.engine.compaction)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from live_api import assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings

pytestmark = pytest.mark.own_server  # a history window of two turns


@pytest.fixture
def settings(fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "fleet.toml"
    config.write_text("[history]\nwindow_turns = 2\n\n[lm]\ncontext_tokens = 16384\n")
    return load_settings({**fleet_env, "FLEET_CONFIG": str(config)})


def summarise(prompt: str) -> str:
    if "Turns to add" in prompt:
        return "Notes: the user's cat is called Miso." if "Miso" in prompt else "Notes: nothing."
    return f"sub-answer: {prompt[:100]}"


def test_history_shows_the_summary_and_the_latest_turns(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.sub = summarise
    scripted_lm.default = step("ok", "SUBMIT(answer='ok')")
    url = f"/api/sessions/{session_id}/history"
    empty = client.get(url).json()
    assert empty["seen"] == 0 and empty["summary"] is None and empty["turns"] == []
    assert empty["window"] == {"turns": 2, "chars": 16384 * 4 // 8, "context_tokens": 16384}

    for task in ("my cat is called Miso", "step 2", "step 3"):
        assert run_turn(client, session_id, task)[-1].event == "turn.completed"
    before = client.get(url).json()  # turn 1 left the window: the next turn folds it in first
    assert (before["seen"], before["summarised"], before["pending"], before["summary"]) == (3, 1, 1, None)
    assert [t["task"] for t in before["turns"]] == ["step 2", "step 3"]

    frames = run_turn(client, session_id, "step 4")
    assert [f.envelope["data"]["role"] for f in frames if f.event == "lm.finished"] == ["sub", "root"]
    after = client.get(url).json()
    summary = after["summary"]
    assert summary["text"] == "Notes: the user's cat is called Miso." and summary["stale"] is False
    assert len(summary["turn_ids"]) == 1
    assert (after["seen"], after["summarised"], after["pending"]) == (4, 2, 1)  # turn 2 waits for turn 5
    assert [t["task"] for t in after["turns"]] == ["step 3", "step 4"]
    assert summary["model"] == "openai/scripted"

    first = summary["turn_ids"][0]
    patched = client.patch(f"/api/sessions/{session_id}/turns/{first}", json={"in_history": False})
    assert patched.status_code == 200, patched.text
    stale = client.get(url).json()
    assert stale["summary"]["stale"] is True  # it covers a forgotten turn: the next turn rebuilds it from turn 2
    assert (stale["seen"], stale["summarised"], stale["pending"]) == (3, 1, 1)
    assert_error(client.get("/api/sessions/ses_nope/history"), 404, "not_found")
