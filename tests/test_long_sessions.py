"""Sessions longer than the history window: older turns are folded into a rolling summary by the sub-model
(fleet_kernel.engine.compaction), through the real runner, store and sandbox, with the scripted LM."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.compaction import known_context, plan_history, window_for
from fleet_kernel.events import Event
from fleet_kernel.store import Store

FACT = "the launch code is ZEBRA-42"
WINDOW = "[history]\nwindow_turns = 3\nmax_chars = 4000\n"


def summarise(prompt: str) -> str:
    """The scripted sub-model: a summary keeps the fact only when the turns or the old summary it is given
    state it, so a fact that reaches the last turn was carried through every fold."""
    if "Turns to add" not in prompt:
        return f"sub-answer: {prompt[:200]}"
    return "Notes: " + (f"{FACT}." if "ZEBRA-42" in prompt else "nothing to keep.")


def folds(lm: ScriptedLM) -> list[str]:
    """The summarising requests the sub-model received, their user prompt each."""
    return [b["messages"][-1]["content"] for b in lm.requests if "Turns to add" in json.dumps(b)]


@pytest.fixture
async def make_runner(fleet_env: dict[str, str], tmp_path: Path, store: Store) -> AsyncIterator[Callable[..., Any]]:
    runners: list[TurnRunner] = []

    async def build(toml: str = WINDOW) -> TurnRunner:
        config = tmp_path / f"fleet-{len(runners)}.toml"
        config.write_text(toml)
        runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
        runners.append(runner)
        return runner

    yield build
    for runner in runners:
        await runner.close()


async def turn(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    events = [event async for event in handle.events()]
    assert events[-1].type == "turn.completed", events[-1].data
    return events


@pytest.mark.slow
async def test_a_30_turn_session_keeps_its_early_facts(make_runner, store: Store, scripted_lm: ScriptedLM) -> None:
    scripted_lm.sub = summarise
    scripted_lm.default = step("Noted.", "SUBMIT(answer='noted')")
    runner = await make_runner()
    session = (await store.create_session()).session_id
    await turn(runner, session, f"Remember this: {FACT}.")
    for n in range(2, 30):  # one step each: ~0.3 s a turn
        await turn(runner, session, f"step {n}: note the number {n}")
    requests_before = len(scripted_lm.requests)
    last = await turn(runner, session, "What is the launch code?")

    # turn 30 sees 29 turns: 3 whole (27-29), the 26 before them in the summary, folded in at its start by
    # one sub-model call that added turn 26 to the summary of turns 1-25
    made = scripted_lm.requests[requests_before:]
    assert [ScriptedLM.is_root(b) for b in made] == [False, True]
    assert made[0]["model"] == "scripted"  # the sub-LM (the root model, as no FLEET_SUB_LM_MODEL is set)
    fold = made[0]["messages"][-1]["content"]
    assert "Summary so far (turns 1-25):" in fold and "Turns to add (turn 26):" in fold and "step 26" in fold
    assert FACT in fold  # carried by the old summary: turn 1 left the window 25 turns ago
    assert len(folds(scripted_lm)) == 26  # once per turn from the 5th on, each adding one turn

    stored = await store.history_summary(session)
    assert stored is not None and FACT in stored.text and len(stored.covers) == 26
    root = made[1]["messages"][-1]["content"]  # the history is in the 30th turn's prompt: summary, then turns
    assert root.index("--- summary of turns 1-26 ---") < root.index(FACT) < root.index("--- turn 27 ---")
    assert "--- turn 29 ---" in root and "step 29" in root and "What is the launch code?" in root
    assert "--- turn 26 ---" not in root and "step 2:" not in root  # older turns only in the summary
    assert "a summary of the older ones, then the latest" in root  # the field says so

    finished = [e.data for e in last if e.type == "lm.finished"]
    assert [d["role"] for d in finished] == ["sub", "root"]  # the summary call is metered like any other
    usage = last[-1].data["usage"]
    assert usage["lm_calls"] == 2 and usage["prompt_tokens"] == sum(d["usage"]["prompt_tokens"] for d in finished)


async def test_a_forgotten_or_rerun_turn_rebuilds_the_summary(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.sub = summarise
    scripted_lm.default = step("Noted.", "SUBMIT(answer='noted')")
    runner = await make_runner()
    session = (await store.create_session()).session_id
    first = await turn(runner, session, f"Remember this: {FACT}.")
    for n in range(2, 6):
        await turn(runner, session, f"step {n}")
    stored = await store.history_summary(session)
    assert stored is not None and stored.covers[0] == first[0].turn_id and FACT in stored.text

    await store.set_in_history(session, first[0].turn_id, False)  # forget turn 1, which the summary covers
    plan = await plan_history(store, session, runner.settings)
    assert plan.summary is None and plan.stale is not None and plan.covered == 0
    await turn(runner, session, "step 6")
    rebuilt = folds(scripted_lm)[-1]
    assert "Summary so far" not in rebuilt and "ZEBRA-42" not in rebuilt  # from the turns alone, turn 1 gone
    stored = await store.history_summary(session)
    assert stored is not None and first[0].turn_id not in stored.covers and FACT not in stored.text

    await store.set_in_history(session, first[0].turn_id, True)  # back in: first again, so rebuilt again
    assert (await plan_history(store, session, runner.settings)).summary is None
    await turn(runner, session, "step 7")
    assert "Summary so far" not in folds(scripted_lm)[-1]
    stored = await store.history_summary(session)
    assert stored is not None and stored.covers[0] == first[0].turn_id and FACT in stored.text

    await store.delete_session(session)  # the summary goes with its session
    assert await store.history_summary(session) is None


async def test_a_failed_summary_call_leaves_the_turn_running(
    make_runner, store: Store, scripted_lm: ScriptedLM
) -> None:
    def broken(prompt: str) -> Any:
        if "Turns to add" in prompt:
            return ""  # an empty summary is refused
        return f"sub-answer: {prompt[:200]}"

    scripted_lm.sub = broken
    scripted_lm.default = step("Noted.", "SUBMIT(answer='noted')")
    runner = await make_runner()
    session = (await store.create_session()).session_id
    for n in range(1, 5):
        await turn(runner, session, f"step {n}")
    last = await turn(runner, session, "step 5")
    root = json.dumps(scripted_lm.root_requests()[-1])
    assert "(turn 1 left out: not in the summary yet)" in root and "--- turn 2 ---" in root
    assert await store.history_summary(session) is None
    assert [e.data["role"] for e in last if e.type == "lm.finished"] == ["sub", "root"]


def test_a_model_s_context_is_litellm_s_figure_read_without_importing_litellm() -> None:
    """The window is sized from LiteLLM's model map, read from the JSON LiteLLM ships: importing LiteLLM for
    it took ~2.5 s of CPU on every process's first turn, which needs nothing else of LiteLLM. The figures are
    LiteLLM's own, aliases included (a fresh interpreter: this one has LiteLLM loaded already)."""
    check = """
import sys
from fleet_kernel.engine.compaction import known_context
models = ["openai/gpt-4.1-mini", "anthropic/claude-sonnet-4-5", "gpt-4o", "ollama/llama3", "openai/scripted"]
mine = [known_context(m) for m in models]
assert "litellm" not in sys.modules, "LiteLLM was imported"
import litellm
aliased = [k for k, v in litellm.model_cost.items() if len(getattr(v, "names", ())) > 1][:20]  # shared rows
mine += [known_context(m) for m in aliased]
def theirs(model):
    for name in (model, model.split("/", 1)[-1]):
        info = litellm.model_cost.get(name) or {}
        value = info.get("max_input_tokens") or info.get("max_tokens")
        if isinstance(value, int) and value > 0:
            return value
print(json.dumps({"same": mine == [theirs(m) for m in [*models, *aliased]], "mine": mine, "aliases": len(aliased)}))
"""
    result = subprocess.run(
        [sys.executable, "-c", "import json" + check], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert seen["same"] and seen["aliases"] > 0, seen
    assert all(seen["mine"][:4]) and seen["mine"][4] is None, seen  # known models; a made-up one is unknown


def test_the_window_is_sized_from_the_model_context(fleet_env: dict[str, str], tmp_path: Path) -> None:
    def window(toml: str, **env: str) -> Any:
        config = tmp_path / "fleet.toml"
        config.write_text(toml)
        return window_for(load_settings({**fleet_env, "FLEET_CONFIG": str(config), **env}))

    assert known_context("openai/scripted") is None  # unknown to LiteLLM: [history] max_chars alone
    assert window("").chars == 16_000 and window("").context_tokens is None
    small = window("[lm]\ncontext_tokens = 16384\n")
    assert small.context_tokens == 16384 and small.chars == 16384 * 4 // 8  # an eighth of the context
    assert small.summary_chars == small.chars // 4
    big = window("", FLEET_LM_MODEL="openai/gpt-4o-mini")  # LiteLLM's map: 128k
    assert big.context_tokens == 128_000 and big.chars == 16_000  # never above [history] max_chars
    assert window("[history]\nwindow_turns = 0\n").off


@pytest.mark.parametrize(
    ("props", "models", "expected"),
    [
        ({"default_generation_settings": {"n_ctx": 8192}}, None, 8192),  # llama.cpp: what it serves with
        (None, {"data": [{"id": "local-model", "max_model_len": 32768}]}, 32768),  # vLLM
        (None, {"data": [{"id": "other", "meta": {"n_ctx_train": 4096}}]}, 4096),  # llama.cpp, one model listed
        (None, {"data": [{"id": "a"}, {"id": "b"}]}, None),  # says nothing of this model
    ],
    ids=["llama.cpp-props", "vllm", "llama.cpp-models", "unknown"],
)
def test_the_window_is_sized_from_what_the_server_reports(
    fleet_env: dict[str, str], props: Any, models: Any, expected: int | None
) -> None:
    answers = {"/props": props, "/v1/models": models}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = answers.get(self.path)
            data = json.dumps(body).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        settings = load_settings({**fleet_env, "FLEET_LM_BASE_URL": base, "FLEET_LM_MODEL": "openai/local-model"})
        window = window_for(settings)
    finally:
        server.shutdown()
        server.server_close()
    assert window.context_tokens == expected
    if expected is not None:
        assert window.chars == min(16_000, expected * 4 // 8)
