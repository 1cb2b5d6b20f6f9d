"""The history a turn sees follows the notebook's cells: a real kernel over ZMQ, with the ``cellId`` that
JupyterLab puts in every execute_request's metadata, and the prompt the scripted LM received."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kernel_harness import Kernel, Run
from scripted_lm import ScriptedLM, step

from fleet_kernel.store import Store


def run_cell(kernel: Kernel, code: str, cell_id: str, timeout: float = 60) -> Run:
    """Execute ``code`` as JupyterLab does for the cell ``cell_id`` (``metadata.cellId``)."""
    return kernel.collect(send_cell(kernel, code, cell_id), timeout)


def send_cell(kernel: Kernel, code: str, cell_id: str) -> str:
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    msg = kernel.kc.session.msg("execute_request", content, metadata={"cellId": cell_id})
    kernel.kc.shell_channel.send(msg)
    return str(msg["header"]["msg_id"])


def answer(lm: ScriptedLM, text: str) -> None:
    lm.add("*", [step("done", f"SUBMIT(answer={text!r})")])


def turn_id(run: Run) -> str:
    return str(run.result["metadata"]["fleet"]["turn_id"])


def last_history(lm: ScriptedLM) -> str:
    """The ``history`` input of the latest root-LM request, as the model read it (a REPL variable's preview)."""
    messages = lm.requests[-1]["messages"]
    text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    return text.split("Variable: `history`", 1)[1].split("\u00bb\u00bb\u00bb", 1)[0]


def turn_started(fleet_home: Path, turn: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        store = await Store.open(f"sqlite+aiosqlite:///{fleet_home / 'fleet.db'}")
        try:
            (first,) = await store.events_after(turn, 0, limit=1)
            return dict(first.data)
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_a_cell_run_again_replaces_its_earlier_turn_in_the_history(kernel: Kernel, scripted_lm: ScriptedLM) -> None:
    answer(scripted_lm, "apple-one")
    first_a = turn_id(run_cell(kernel, "alpha: name a fruit", "cell-a"))
    answer(scripted_lm, "blue-one")
    run_cell(kernel, "beta: name a colour", "cell-b")
    answer(scripted_lm, "carrot-two")
    second_a = turn_id(run_cell(kernel, "alpha: name a vegetable", "cell-a"))
    answer(scripted_lm, "done")
    run_cell(kernel, "gamma: what came before?", "cell-c")

    history = last_history(scripted_lm)
    assert "name a fruit" not in history and "apple-one" not in history
    assert history.index("alpha: name a vegetable") < history.index("carrot-two") < history.index("beta: name a colour")
    assert "blue-one" in history
    started = turn_started(kernel.home, second_a)
    assert started["cell_id"] == "cell-a" and started["supersedes_turn_id"] == first_a
    assert turn_started(kernel.home, first_a)["supersedes_turn_id"] is None


@pytest.mark.slow
def test_a_cancelled_rerun_leaves_the_cells_earlier_turn_in_place(kernel: Kernel, scripted_lm: ScriptedLM) -> None:
    answer(scripted_lm, "apple-one")
    run_cell(kernel, "alpha: name a fruit", "cell-a")
    answer(scripted_lm, "blue-one")
    first_b = turn_id(run_cell(kernel, "beta: name a colour", "cell-b"))
    scripted_lm.add("*", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = send_cell(kernel, "beta: name a colour slowly", "cell-b")
    kernel.wait_for_output(msg_id, "sleeping")
    kernel.km.interrupt_kernel()
    cancelled = kernel.collect(msg_id, timeout=30)
    assert cancelled.reply["content"]["ename"] == "TurnCancelled"

    shown = kernel.run("%fleet history").text()
    assert first_b in shown and turn_id(cancelled) not in shown
    answer(scripted_lm, "done")
    run_cell(kernel, "gamma: what came before?", "cell-c")
    history = last_history(scripted_lm)
    assert "blue-one" in history and "slowly" not in history and "cancelled" not in history


@pytest.mark.slow
def test_history_lists_what_the_next_turn_sees_and_forgets_and_restores_a_turn(
    kernel: Kernel, scripted_lm: ScriptedLM
) -> None:
    assert "No session yet" in kernel.run("%fleet history").text()
    answer(scripted_lm, "apple-one")
    a = turn_id(run_cell(kernel, "alpha: name a fruit\nand say why", "cell-aaaaaaaa-1"))
    answer(scripted_lm, "blue-one")
    b = turn_id(run_cell(kernel, "beta: name a colour", "cell-bbbbbbbb-2"))

    shown = kernel.run("%fleet history").text()
    assert "The next turn sees 2 earlier turns, in this order:" in shown
    assert f"1. {a}  cell cell-aaa" in shown and "alpha: name a fruit -> apple-one" in shown
    assert f"2. {b}  cell cell-bbb" in shown and "beta: name a colour -> blue-one" in shown
    assert "and say why" not in shown  # one line of the task

    forget = kernel.run(f"%fleet history forget {a}")
    assert f"%fleet history restore {a}" in forget.text()
    shown = kernel.run("%fleet history").text()
    assert "sees 1 earlier turn," in shown and f"1. {b}" in shown
    assert f"Forgotten (%fleet history restore <turn_id>): {a}" in shown
    answer(scripted_lm, "done")
    c = turn_id(run_cell(kernel, "gamma: what came before?", "cell-c"))
    assert "apple-one" not in last_history(scripted_lm) and "blue-one" in last_history(scripted_lm)

    kernel.run(f"%fleet history restore {a}")
    shown = kernel.run("%fleet history").text()
    assert f"1. {a}" in shown and f"2. {b}" in shown and f"3. {c}" in shown and "Forgotten" not in shown
    answer(scripted_lm, "done again")
    run_cell(kernel, "delta: and now?", "cell-d")
    assert "apple-one" in last_history(scripted_lm)

    bad = kernel.run("%fleet history forget turn_nope")
    assert bad.reply["content"]["status"] == "error" and "no turn 'turn_nope'" in bad.text()
    assert "usage: %fleet history" in kernel.run("%fleet history drop").text()


def test_turns_without_a_cell_id_keep_the_append_only_history(kernel: Kernel, scripted_lm: ScriptedLM) -> None:
    answer(scripted_lm, "apple-one")
    kernel.run("alpha: name a fruit")
    answer(scripted_lm, "apple-two")
    kernel.run("alpha: name a fruit")
    answer(scripted_lm, "done")
    kernel.run("gamma: what came before?")
    history = last_history(scripted_lm)
    assert "apple-one" in history and "apple-two" in history
    assert json.dumps(scripted_lm.requests[-1]).count("alpha: name a fruit") == 2


@pytest.mark.slow
def test_history_shows_the_summary_of_turns_past_the_window(
    start_kernel: Any, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    config = tmp_path / "window.toml"
    config.write_text("[history]\nwindow_turns = 1\n")
    kernel = start_kernel(FLEET_CONFIG=str(config))
    scripted_lm.sub = lambda prompt: "Notes: the budget is 300 EUR." if "Turns to add" in prompt else "sub"
    for n, task in enumerate(["our budget is 300 EUR", "pick a hotel", "book it"], 1):
        answer(scripted_lm, f"ok {n}")
        run_cell(kernel, task, f"cell-{n}")
    shown = kernel.run("%fleet history").text()
    assert "The next turn sees 3 earlier turns: turns 1-2 summarised by the sub-model, then the latest 1 whole" in shown
    assert "Summary of turn 1 (written by openai/scripted" in shown and "Notes: the budget is 300 EUR." in shown
    assert "(the next turn first adds turn 2 to the summary)" in shown
    assert "3. " in shown and "book it -> ok 3" in shown
