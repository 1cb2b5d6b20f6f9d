"""The LM edge over HTTP: a session's model may only be one the operator configured (its provider, so its
endpoint, and a cassette from the cassettes folder), no key reaches an event, stream or notebook, each LM
request has its own timeout, and LM errors say in Fleet's words which variable or fleet.toml key to set."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_api import LiveServer, assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.store import Store

FLEET_KEY = "sk-fleet-operator-key-0123456789"
PROVIDER_KEY = "sk-openai-provider-key-9876543210"


class Listener:
    """A loopback port that records whatever is sent to it and answers nothing (``reply=False``: never
    accepts, so a client waits as on a model server that took the connection and hangs)."""

    def __init__(self, *, accept: bool = True) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.received: list[bytes] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        if accept:
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    stand_in = Listener()
    yield stand_in
    stand_in.close()


def serve(env: dict[str, str], toml: str | None, tmp_path: Path) -> LiveServer:
    if toml is not None:
        (tmp_path / "fleet.toml").write_text(toml)
        env = {**env, "FLEET_CONFIG": str(tmp_path / "fleet.toml")}
    return LiveServer(load_settings(env))


def hosted(fleet_home: Path) -> dict[str, str]:
    """The usual hosted-provider setup: a model and its key, no FLEET_LM_BASE_URL."""
    return {"FLEET_HOME": str(fleet_home), "FLEET_LM_MODEL": "openai/gpt-4.1-mini", "FLEET_LM_API_KEY": FLEET_KEY}


async def _set_model(database_url: str, session_id: str, model: str) -> None:
    store = await Store.open(database_url)
    try:
        await store.update_session(session_id, model=model)
    finally:
        await store.close()


def test_a_session_cannot_send_the_key_to_another_endpoint(
    fleet_home: Path, tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where LiteLLM sends ollama/ and llamafile/ requests: the local user's listener stands in for them.
    monkeypatch.setenv("OLLAMA_API_BASE", listener.url)
    monkeypatch.setenv("LLAMAFILE_API_BASE", listener.url + "/v1")
    env = hosted(fleet_home)
    with serve(env, None, tmp_path) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        for change in ({"model": "ollama/m"}, {"sub_model": "llamafile/m"}, {"model": "anthropic/claude-x"}):
            error = assert_error(client.patch(f"/api/sessions/{sid}", json=change), 422, "model_not_allowed")
            assert "[lm] allowed_models" in error["message"] and "fleet.toml" in error["message"]
            assert FLEET_KEY not in error["message"]
        config = client.get(f"/api/sessions/{sid}/config").json()
        assert (config["model"], config["model_source"]) == ("openai/gpt-4.1-mini", "settings")
        assert client.patch(f"/api/sessions/{sid}", json={"model": "openai/gpt-4.1"}).status_code == 200

        # A model stored before the operator's policy said otherwise is refused when the turn starts.
        asyncio.run(_set_model(load_settings(env).database_url, sid, "ollama/m"))
        frames = run_turn(client, sid, "say hello")
    assert frames[-1].event == "turn.failed"
    assert frames[-1].envelope["data"]["error"]["type"] == "model_not_allowed"
    assert listener.received == []


def test_allowed_models_in_fleet_toml_lets_sessions_choose_them(fleet_home: Path, tmp_path: Path) -> None:
    toml = '[lm]\nallowed_models = ["openai/*", "ollama/llama3*"]\n'
    with serve(hosted(fleet_home), toml, tmp_path) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        assert client.patch(f"/api/sessions/{sid}", json={"model": "ollama/llama3.2"}).status_code == 200
        assert_error(client.patch(f"/api/sessions/{sid}", json={"model": "ollama/qwen"}), 422, "model_not_allowed")


def _cassette(path: Path, prompt: str) -> None:
    exchange = {"key": "k", "loose": "l", "messages": [{"role": "user", "content": prompt}],
                "response": {"text": "recorded answer"}}  # fmt: skip
    path.write_text(json.dumps({"version": 1, "exchanges": [exchange]}))


def test_replay_cassettes_come_only_from_the_cassettes_folder(
    fleet_home: Path, tmp_path: Path, scripted_lm: ScriptedLM
) -> None:
    outside = tmp_path / "private.json"
    outside.write_text('{"private": "PRIVATE-BYTES-outside"}')
    folder = fleet_home / "cassettes"
    folder.mkdir()
    (folder / "broken.json").write_bytes(b"\x89PNG PRIVATE-BYTES-inside \xff\xfe")
    _cassette(folder / "other.json", "OTHER-RECORDED-PROMPT: the finances of someone else")
    env = {"FLEET_HOME": str(fleet_home), **scripted_lm.env()}
    with serve(env, None, tmp_path) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        for model in (f"replay/{outside}", "replay/../../private.json", "replay//etc/passwd", "replay/"):
            error = assert_error(client.patch(f"/api/sessions/{sid}", json={"model": model}), 422)
            assert "[lm] cassettes_dir" in error["message"] or "model" in error["message"]

        assert client.patch(f"/api/sessions/{sid}", json={"model": "replay/broken.json"}).status_code == 200
        broken = run_turn(client, sid, "replay the broken one")[-1].envelope["data"]["error"]
        assert broken["type"] == "lm_replay_invalid" and "broken.json" in broken["message"]
        assert "PRIVATE" not in broken["message"] and "position" not in broken["message"]
        assert "0x89" not in broken["message"]

        assert client.patch(f"/api/sessions/{sid}", json={"model": "replay/other.json"}).status_code == 200
        miss = run_turn(client, sid, "ask what was never recorded")[-1].envelope["data"]["error"]
    assert "has no answer for this request" in miss["message"] and "other.json" in miss["message"], miss
    assert "OTHER-RECORDED-PROMPT" not in miss["message"] and "finances" not in miss["message"]


def test_keys_reach_no_event_stream_turn_or_notebook(
    fleet_home: Path, tmp_path: Path, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", PROVIDER_KEY)
    env = {"FLEET_HOME": str(fleet_home), **scripted_lm.env(FLEET_LM_API_KEY=FLEET_KEY), "OPENAI_API_KEY": PROVIDER_KEY}
    code = f"print('keys:', {FLEET_KEY!r}, {PROVIDER_KEY!r})"
    scripted_lm.add(
        "check the keys", [step(f"Use {FLEET_KEY}.", code), step("Done.", f"SUBMIT(answer={PROVIDER_KEY!r})")]
    )
    with serve(env, None, tmp_path) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        frames = run_turn(client, sid, f"check the keys {FLEET_KEY} and {PROVIDER_KEY}")
        turn_id = frames[0].envelope["turn_id"]
        stored = client.get(f"/api/sessions/{sid}/turns/{turn_id}/events").text
        turn = client.get(f"/api/sessions/{sid}/turns/{turn_id}").text
        notebook = client.get(f"/api/sessions/{sid}/notebook").text
    assert frames[-1].event == "turn.completed", frames[-1].envelope
    streamed = json.dumps([f.envelope for f in frames])
    assert "keys: ***" in streamed and "print('keys:'" in streamed  # the step is shown, without its keys
    for seen in (streamed, stored, turn, notebook):
        assert FLEET_KEY not in seen and PROVIDER_KEY not in seen


@pytest.mark.slow
def test_a_model_server_that_never_answers_fails_the_turn_at_the_request_timeout(
    fleet_home: Path, tmp_path: Path
) -> None:
    hang = Listener(accept=False)  # the connection is taken by the kernel's backlog; no byte ever comes back
    env = {"FLEET_HOME": str(fleet_home), "FLEET_LM_MODEL": "openai/m", "FLEET_LM_BASE_URL": hang.url + "/v1",
           "FLEET_LM_API_KEY": FLEET_KEY}  # fmt: skip
    toml = "[lm]\nrequest_timeout_s = 1\n[limits]\nturn_timeout_s = 120\n"
    try:
        with serve(env, toml, tmp_path) as live, httpx.Client(base_url=live.url, timeout=180) as client:
            sid = client.post("/api/sessions", json={}).json()["session_id"]
            frames = run_turn(client, sid, "anyone there?")
    finally:
        hang.close()
    assert frames[-1].event == "turn.failed"
    error = frames[-1].envelope["data"]["error"]
    assert hang.url in error["message"] and "[lm] request_timeout_s" in error["message"], error


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FLEET_LM_MODEL": "openai/gpt-4.1-mini"}, ["FLEET_LM_API_KEY", "OPENAI_API_KEY"]),
        ({"FLEET_LM_MODEL": "opneai/gpt-4.1-mini", "FLEET_LM_API_KEY": FLEET_KEY}, ["FLEET_LM_MODEL", "opneai"]),
        ({"FLEET_LM_BASE_URL": "http://127.0.0.1:9/v1"}, ["FLEET_LM_MODEL is not set", "http://127.0.0.1:9/v1"]),
    ],
    ids=["missing-key", "misspelled-provider", "base-url-alone"],
)
def test_lm_errors_name_the_variable_to_set(
    fleet_home: Path, tmp_path: Path, env: dict[str, str], names: list[str]
) -> None:
    live = serve({"FLEET_HOME": str(fleet_home), **env}, None, tmp_path)
    with live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={}).json()["session_id"]
        frames = run_turn(client, sid, "hello")
    message = frames[-1].envelope["data"]["error"]["message"]
    assert frames[-1].event == "turn.failed"
    for name in names:
        assert name in message, message
    for wording in ("api_key=", "dspy.LM", "Huggingface", "completion(model="):  # dspy's and LiteLLM's advice
        assert wording not in message, message
    assert FLEET_KEY not in message
