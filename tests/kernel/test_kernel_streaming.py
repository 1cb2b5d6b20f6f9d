"""The kernel shows the model's reasoning as its tokens stream, before the LM call has ended."""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

import pytest
from kernel_harness import Kernel
from scripted_lm import ScriptedLM, step
from test_kernel_widgets import attach_widget_manager

REASONING = "Let me look at the numbers one by one before writing any code. " * 12  # ~750 chars: 190 chunks


def first_showing(kernel: Kernel, msg_id: str, needle: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """IOPub messages of ``msg_id`` up to the one of ``kinds`` after which ``needle`` shows (streams add up;
    a widget's value is whole)."""
    seen, streamed = [], ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.5)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "stream":
            streamed += msg["content"]["text"]
        if msg["msg_type"] in kinds and needle in (streamed + str(msg["content"])):
            return seen
    raise AssertionError(f"{needle!r} never appeared; got {[m['msg_type'] for m in seen]}")


@pytest.mark.slow
def test_console_text_shows_partial_reasoning_before_the_call_ends(kernel: Kernel, scripted_lm: ScriptedLM) -> None:
    assert "(text)" in kernel.run("%fleet output text").text()
    scripted_lm.token_delay_s = 0.02  # the reply takes ~4 s to stream
    scripted_lm.add("numbers", [step(REASONING, "print(1)"), step("done", "SUBMIT(answer='one')")])
    msg_id = kernel.submit("look at the numbers")
    seen = first_showing(kernel, msg_id, "reasoning: Let me look", ("stream",))
    assert not scripted_lm.streamed  # the first reply is still streaming
    run = kernel.collect(msg_id)
    assert run.reply["content"]["status"] == "ok"
    printed = "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")
    printed += "".join(c["text"] for c in run.of("stream"))
    assert REASONING.strip() in printed and printed.count("Let me look at the numbers") == 12  # once, not twice


@pytest.mark.slow
def test_widget_card_shows_partial_reasoning_before_the_call_ends(kernel: Kernel, scripted_lm: ScriptedLM) -> None:
    attach_widget_manager(kernel)
    scripted_lm.token_delay_s = 0.02
    scripted_lm.add("numbers", [step(REASONING, "print(1)"), step("done", "SUBMIT(answer='one')")])
    msg_id = kernel.submit("look at the numbers")
    first_showing(kernel, msg_id, "Let me look at the numbers", ("comm_msg",))
    assert not scripted_lm.streamed
    run = kernel.collect(msg_id)
    assert run.reply["content"]["status"] == "ok"
    assert "Let me look at the numbers" in run.result["data"]["text/markdown"]  # the transcript has the step's text
