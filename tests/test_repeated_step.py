"""A model that runs the same code again, printing the same, is told so in what it sees next (small models loop
on a printed answer instead of SUBMITting it); the events show the output as printed."""

from __future__ import annotations

import json
from pathlib import Path

from one_turn import one_turn as _turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.sandbox.interpreter import REPEATED_STEP_NOTE
from fleet_kernel.store import Store

SAME = step("Find it.", "print(max('a bbb cc'.split(), key=len))")


async def test_a_repeated_step_is_noted_to_the_model_only(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [SAME, SAME, step("Done.", "SUBMIT(answer='bbb')")])
    events = await _turn(store, fleet_env, tmp_path, "the longest word")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "bbb", events[-1].data
    prompts = [json.dumps(body["messages"]) for body in scripted_lm.root_requests()]
    note = json.dumps(REPEATED_STEP_NOTE.strip())[1:-1]
    assert note not in prompts[1]  # the first run of the code is not a repeat
    assert note in prompts[2]  # the second, word for word the same with the same output, is
    outputs = [e.data["text"] for e in events if e.type == "output"]
    assert outputs == ["bbb\n", "bbb\n"]  # what the user sees is what the code printed


async def test_a_step_with_new_code_is_not_noted(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    other = step("Again.", "print(max('a bbb cc'.split(), key=len))  # check")
    scripted_lm.add("*", [SAME, other, step("Done.", "SUBMIT(answer='bbb')")])
    await _turn(store, fleet_env, tmp_path, "the longest word")
    note = json.dumps(REPEATED_STEP_NOTE.strip())[1:-1]
    assert all(note not in json.dumps(body["messages"]) for body in scripted_lm.root_requests())
