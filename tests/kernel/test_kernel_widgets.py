"""Tests for the live ipywidgets card: what a widget frontend (JupyterLab) receives, and its Stop button."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kernel_harness import Kernel
from scripted_lm import step

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def attach_widget_manager(kernel: Kernel) -> None:
    """Do what JupyterLab's widget manager does on connect: open the widget control comm."""
    content = {"comm_id": uuid.uuid4().hex, "target_name": "jupyter.widget.control", "data": {}}
    msg = kernel.kc.session.msg("comm_open", content, metadata={"version": "1.0.0"})
    kernel.kc.shell_channel.send(msg)
    kernel.run("%fleet output")  # a round trip: the comm_open has been handled


def widget_models(messages: list[dict[str, Any]]) -> dict[str, str]:
    """``{comm_id: model name}`` of the widgets the kernel opened."""
    return {
        m["content"]["comm_id"]: m["content"]["data"]["state"]["_model_name"]
        for m in messages
        if m["msg_type"] == "comm_open"
    }


@pytest.mark.slow
def test_widget_frontends_get_a_live_card_then_the_transcript(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    code = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
    scripted_lm.add("count", [step("count slowly", code), step("done", "SUBMIT(answer='three')")])
    run = kernel.run("count to three")
    assert run.reply["content"]["status"] == "ok"
    (card,) = [c for c in run.of("display_data") if WIDGET_VIEW in c["data"]]
    assert "Fleet turn" in card["data"]["text/plain"]  # readable without widgets
    models = widget_models(run.messages)
    assert {"AccordionModel", "ButtonModel", "HTMLModel"} <= set(models.values())
    updates = [m["content"]["data"]["state"] for m in run.messages if m["msg_type"] == "comm_msg"]
    assert any("tick 2" in str(state.get("value", "")) for state in updates)
    assert any("iteration 2/" in str(state.get("value", "")) for state in updates)
    assert run.types.index("clear_output") < run.types.index("execute_result") == len(run.types) - 1
    assert "three" in run.result["data"]["text/markdown"]


def test_the_stop_button_cancels_the_turn(kernel: Kernel, scripted_lm) -> None:
    attach_widget_manager(kernel)
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy task")
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        "sleeping" in str(m["content"]) for m in seen if m["msg_type"] == "comm_msg"
    ):
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen.append(msg)
    (button,) = [cid for cid, name in widget_models(seen).items() if name == "ButtonModel"]
    click = kernel.kc.session.msg(
        "comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}}
    )
    kernel.kc.shell_channel.send(click)
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
        times = [t for t, m in zip(run.times, run.messages, strict=True) if m["msg_type"] in kinds]
        return max(sum(1 for t in times if start <= t < start + 1) for start in times)

    # updates: the output four times a second and the status once (about 5/s), plus a few where an
    # iteration ends and the next begins
    assert most_in_a_second(("comm_msg",)) <= 12
    # widgets are only opened for new iterations, and every one is closed when the transcript replaces the card
    assert run.types.count("comm_open") == run.types.count("comm_close") <= 20
    values = [str(m["content"]["data"]["state"].get("value", "")) for m in run.messages if m["msg_type"] == "comm_msg"]
    assert any("line 149" in value for value in values)  # the last state arrived
