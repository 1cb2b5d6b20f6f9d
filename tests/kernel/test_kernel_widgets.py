"""Tests for the live ipywidgets card: what a widget frontend (JupyterLab) receives, its Stop button, and the
feedback bar under the answer."""

from __future__ import annotations

import time

import pytest
from kernel_harness import (
    WIDGET_VIEW,
    Kernel,
    Run,
    attach_widget_manager,
    click,
    send_comm,
    wait_for_state,
    widget_models,
)
from scripted_lm import step


@pytest.mark.slow
def test_widget_frontends_get_a_live_card_then_the_transcript(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    code = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
    scripted_lm.add("count", [step("count slowly", code), step("done", "SUBMIT(answer='three')")])
    run = kernel.run("count to three")
    assert run.reply["content"]["status"] == "ok"
    card, _feedback_bar = [c for c in run.of("display_data") if WIDGET_VIEW in c["data"]]
    assert "Fleet turn" in card["data"]["text/plain"]  # readable without widgets
    models = widget_models(run.messages)
    assert {"AccordionModel", "ButtonModel", "HTMLModel"} <= set(models.values())
    updates = [m["content"]["data"]["state"] for m in run.messages if m["msg_type"] == "comm_msg"]
    assert any("tick 2" in str(state.get("value", "")) for state in updates)
    assert any("iteration 2/" in str(state.get("value", "")) for state in updates)
    # the transcript replaces the card; after it come only the feedback bar's widgets and its display
    end = run.types.index("execute_result")
    assert run.types.index("clear_output") < end
    assert set(run.types[end + 1 :]) == {"comm_open", "display_data"} and run.types[-1] == "display_data"
    assert "three" in run.result["data"]["text/markdown"]


@pytest.mark.slow
def test_the_stop_button_cancels_the_turn(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy task")
    seen = []
    deadline = time.monotonic() + 30
    while not any(
        "sleeping" in str(m["content"]) for m in seen if m["msg_type"] in ("comm_open", "comm_msg")
    ):  # a section made after the output arrived opens with it
        assert time.monotonic() < deadline, "the card never showed the code's output"
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen.append(msg)
    (button,) = [cid for cid, name in widget_models(seen).items() if name == "ButtonModel"]
    click(kernel, button)
    run = kernel.collect(msg_id, timeout=15)
    assert run.reply["content"]["ename"] == "TurnCancelled"
    assert "stopped from the notebook" in run.reply["content"]["evalue"]


@pytest.mark.slow
def test_the_card_stays_under_the_message_budget(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    chatty = "import time\nfor i in range(150):\n    print('line', i, flush=True)\n    time.sleep(0.01)"
    scripted_lm.add("chatty", [step("print a lot", chatty), step("done", "SUBMIT(answer='done')")])
    run = kernel.run("a chatty task")

    def most_in_a_second(kinds: tuple[str, ...]) -> int:
        """By the kernel's own send times (each header's ``date``): on a busy machine messages can reach the
        client bunched together, which is not the rate the kernel sends at."""
        times = [m["header"]["date"].timestamp() for m in run.messages if m["msg_type"] in kinds]
        return max(sum(1 for t in times if start <= t < start + 1) for start in times)

    # updates: the output four times a second and the status once (about 5/s), plus a few where an
    # iteration ends and the next begins
    assert most_in_a_second(("comm_msg",)) <= 12
    # widgets are only opened for new iterations, and every one is closed when the transcript replaces the card
    card = run.types[: run.types.index("execute_result")]
    assert card.count("comm_open") == card.count("comm_close") <= 20
    values = [str(m["content"]["data"]["state"].get("value", "")) for m in run.messages if m["msg_type"] == "comm_msg"]
    assert any("line 149" in value for value in values)  # the last state arrived


def feedback_bar(run: Run) -> tuple[str, str, str]:
    """The comm ids of the feedback bar's 👍, 👎 and note, after checking the bar's display."""
    end = run.types.index("execute_result")
    bar = run.messages[-1]["content"]
    assert run.types[-1] == "display_data" and WIDGET_VIEW in bar["data"]
    # without widgets (a saved notebook), the bar says how to mark the answer instead
    turn_id = run.result["metadata"]["fleet"]["turn_id"]
    assert f"%fleet feedback good|bad [note] --turn {turn_id}" in bar["data"]["text/plain"]
    models = widget_models(run.messages[end:])
    good, bad = [cid for cid, name in models.items() if name == "ButtonModel"]
    (note,) = [cid for cid, name in models.items() if name == "TextModel"]
    return good, bad, note


def test_the_feedback_bar_marks_the_answer(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    scripted_lm.add("capital of Peru", [step("Lima.", "SUBMIT(answer='Lima')")])
    run = kernel.run("capital of Peru")
    assert run.reply["content"]["status"] == "ok"
    good, bad, note = feedback_bar(run)
    send_comm(kernel, note, {"method": "update", "state": {"value": "terse, but right"}, "buffer_paths": []})
    click(kernel, bad)
    wait_for_state(kernel, "marked bad: terse, but right")
    assert "marked bad: terse, but right" in kernel.run("%fleet feedback").text()
    click(kernel, good)  # the bar is disabled once marked: the mark stays
    assert "marked bad" in kernel.run("%fleet feedback").text()

    # a failed turn gets no bar: there is no answer to mark
    scripted_lm.add("a failing task", [{"status": 401, "error": "bad key"}])
    failed = kernel.run("a failing task")
    assert failed.reply["content"]["status"] == "error"
    assert "TextModel" not in widget_models(failed.messages).values()
