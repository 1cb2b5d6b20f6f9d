"""What Fleet adds to the model's prompt earns its place: an empty history or workspace adds no input and no words.

A small model read an empty ``history`` input as the task and a workspace description as a file path; the first
turn of an empty session now asks exactly what raw dspy.RLM would, plus one line on where to save outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.events import Event
from fleet_kernel.store import Store

MARKERS = ("Variable: `history`", "Variable: `workspace`", "`history`", "`workspace`")


def _prompt(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body["messages"])


async def _turn(runner: TurnRunner, session_id: str, task: str) -> list[Event]:
    handle = await runner.start(session_id, task)
    return [event async for event in handle.events()]


async def test_a_first_turn_in_an_empty_session_has_no_history_or_workspace_input(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("first task", [
        step("Save it.", "open('/workspace/artifacts/out.txt', 'w').write('made')\nSUBMIT(answer='saved')"),
    ])  # fmt: skip
    scripted_lm.add("second task", [step("Done.", "SUBMIT(answer='ok')")])
    config = tmp_path / "fleet.toml"
    config.write_text("", encoding="utf-8")
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_CONFIG": str(config)})).open()
    try:
        session = await store.create_session()
        first = await _turn(runner, session.session_id, "first task")
        assert first[-1].type == "turn.completed", first[-1].data
        [asked] = scripted_lm.root_requests()
        prompt = _prompt(asked)
        assert "Variable: `task`" in prompt and "first task" in prompt
        assert not [marker for marker in MARKERS if marker in prompt], prompt
        assert "first turn of the session" not in prompt and "are empty" not in prompt

        second = await _turn(runner, session.session_id, "second task")
        assert second[-1].type == "turn.completed", second[-1].data
        prompt = _prompt(scripted_lm.root_requests()[-1])
        # now there is something to say: the first turn, and the artifact it saved
        assert "Variable: `history`" in prompt and "User: first task" in prompt
        assert "Variable: `workspace`" in prompt and "artifacts/out.txt" in prompt
    finally:
        await runner.close()


async def test_tools_with_nothing_to_act_on_are_callable_but_not_described(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM
) -> None:
    """A session without memories, and cards without resources: ``search_memories``, ``forget`` and
    ``read_skill_resource`` are not described (nothing to find, delete or read), yet code can call them;
    once the session has a memory, the prompt describes the two memory tools."""
    scripted_lm.add("keep a fact", [
        step("Look, then keep it.", "print('found', search_memories('tide'))\nmid = remember('high tide at 6')\nprint(mid)"),
        step("Done.", "SUBMIT(answer='kept')"),
    ])  # fmt: skip
    scripted_lm.add("recall the fact", [step("Find it.", "SUBMIT(answer=search_memories('tide')[0]['content'])")])
    runner = await TurnRunner(store, load_settings(fleet_env)).open()
    try:
        session = await store.create_session()
        first = await _turn(runner, session.session_id, "keep a fact")
        assert first[-1].type == "turn.completed", first[-1].data
        printed = "".join(e.data["text"] for e in first if e.type == "output")
        assert "found []" in printed  # called, though the prompt did not describe it
        prompt = _prompt(scripted_lm.root_requests()[0])
        assert '`remember(content, kind="note")`' in prompt and "`load_skill(name)`" in prompt
        assert not [name for name in ("`search_memories(", "`forget(", "`read_skill_resource(") if name in prompt]
        assert ": string" not in prompt  # Python calls, not JSON Schema types

        second = await _turn(runner, session.session_id, "recall the fact")
        assert second[-1].type == "turn.completed" and second[-1].data["answer"] == "high tide at 6", second[-1].data
        prompt = _prompt(scripted_lm.root_requests()[-1])
        assert "`search_memories(query, limit=5)`" in prompt and "`forget(memory_id)`" in prompt
        assert "`read_skill_resource(" not in prompt
    finally:
        await runner.close()
