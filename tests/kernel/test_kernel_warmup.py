"""A fresh kernel loads dspy in the background from its first kernel_info: cells sent at once still work."""

from __future__ import annotations

import time
from queue import Empty

import pytest
from kernel_harness import Kernel
from scripted_lm import step


@pytest.mark.slow
def test_commands_and_a_turn_sent_right_after_start_work_while_the_engine_loads(start_kernel, scripted_lm) -> None:
    kernel = start_kernel()  # a fresh one: what happens while it loads is the point
    status = kernel.run("%fleet status")  # the first request after kernel_info: dspy is still loading
    assert status.reply["content"]["status"] == "ok" and "engine loaded:" in status.text()
    scripted_lm.add("first task", [step("look", "print(6 * 7)"), step("done", "SUBMIT(answer='forty-two')")])
    turn = kernel.run("the first task")
    assert turn.reply["content"]["status"] == "ok" and "forty-two" in turn.result["data"]["text/plain"]
    assert "42" in turn.text()
    deadline = time.monotonic() + 60
    while "engine loaded: yes" not in kernel.run("%fleet status").text():
        assert time.monotonic() < deadline, "the engine never finished loading"
        time.sleep(0.2)


@pytest.mark.slow
def test_interrupting_the_first_cell_of_a_fresh_kernel_cancels_it(start_kernel, scripted_lm) -> None:
    kernel = start_kernel()  # a fresh one: what happens while it loads is the point
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy first task")  # sent while the kernel still loads the engine
    _first_output(kernel, msg_id)  # the cell is running: "starting the turn"
    kernel.km.interrupt_kernel()
    run = kernel.collect(msg_id, timeout=30)
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == "TurnCancelled"
    assert kernel.km.is_alive()
    # the longer key wins over "sleepy", which the history of this session also holds
    scripted_lm.add("the kernel carries on", [step("done", "SUBMIT(answer='back again')")])
    assert "back again" in kernel.run("check the kernel carries on").result["data"]["text/plain"]


def _first_output(kernel: Kernel, msg_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.5)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("display_data", "stream"):
            return
    raise AssertionError("the cell showed nothing within 30 s")
