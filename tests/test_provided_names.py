"""Names the sandbox gives the model cannot be silently replaced by model code.

A real model's code defined its own ``llm_query`` and went on calling it: no sub-model call was ever made, and
nothing said so. After each step the sandbox puts such a name back and tells the model on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.sandbox import probe_bwrap
from fleet_kernel.store import Store
from fleet_kernel.transcript import render_text
from fleet_kernel.view import TurnView


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "pyodide"])  # the one runtime.py, in CPython and in Pyodide
async def test_a_redefined_llm_query_is_restored_and_reported(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path, backend: str
) -> None:
    if backend == "local" and probe_bwrap() is not None:
        pytest.skip(f"bubblewrap cannot run here: {probe_bwrap()}")
    scripted_lm.add("*", [
        step("My own helper.", "def llm_query(p):\n    return 'fake'\nprint('mine says', llm_query('first question'))"),
        step("Ask again.", "print(llm_query('second question'))"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    config = tmp_path / "fleet.toml"
    config.write_text("", encoding="utf-8")
    env = {**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": backend}
    runner = await TurnRunner(store, load_settings(env)).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "classify with the sub-model")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    assert events[-1].type == "turn.completed", events[-1].data
    outputs = [e.data for e in events if e.type == "output"]
    first = "".join(d["text"] for d in outputs if d["iteration"] == 1)
    assert "mine says fake" in first  # the step that redefined it ran its own, once
    notice = [d for d in outputs if d["iteration"] == 1 and d["stream"] == "stderr"]
    assert notice and "llm_query is provided by the sandbox" in notice[0]["text"]
    assert "the original was restored" in notice[0]["text"]
    assert "Call llm_query(...) as given; never define or assign it" in notice[0]["text"]
    # the next step's call reached the host's sub-model
    sub_prompts = [str(b["messages"]) for b in scripted_lm.requests if not scripted_lm.is_root(b)]
    assert any("second question" in p for p in sub_prompts) and not any("first question" in p for p in sub_prompts)
    second = "".join(d["text"] for d in outputs if d["iteration"] == 2)
    assert "sub-answer: second question" in second
    # the model was told too: the notice is in the step output of its next prompt
    assert any("llm_query is provided by the sandbox" in str(b["messages"]) for b in scripted_lm.root_requests()[1:])
    assert "llm_query is provided by the sandbox" in render_text(TurnView.of(events))


async def test_a_deleted_or_reassigned_tool_and_submit_are_restored(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [
        step("Clobber.", "SUBMIT = print\nremember = None\ndel llm_query_batched"),
        step("Done.", "SUBMIT(answer=str(callable(remember)))"),
    ])  # fmt: skip
    config = tmp_path / "fleet.toml"
    config.write_text("", encoding="utf-8")
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "clobber the names")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "True", events[-1].data
    text = "".join(e.data["text"] for e in events if e.type == "output" and e.data["stream"] == "stderr")
    assert "SUBMIT" in text and "remember" in text and "llm_query_batched" in text and "are provided" in text
