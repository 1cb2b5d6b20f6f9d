"""Tests for ``jupyter console --kernel fleet`` driven like a person at a terminal (pexpect, text output)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pexpect
import pytest
from kernel_harness import KERNEL
from scripted_lm import step

PROMPT = r"In \[\d+\]: "


@pytest.mark.slow
def test_console_streams_a_turn_interrupts_and_exits(fleet_env: dict[str, str], scripted_lm) -> None:
    ticks = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.2)"
    scripted_lm.add("count", [step("count slowly", ticks), step("done", "SUBMIT(answer='counted to three')")])
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    console = Path(sys.executable).parent / "jupyter-console"
    env = {**os.environ, **fleet_env, "FLEET_OUTPUT": "text", "TERM": "dumb"}
    child = pexpect.spawn(str(console), ["--kernel", KERNEL, "--simple-prompt"], env=env, encoding="utf-8", timeout=60)
    child.logfile_read = screen = io.StringIO()
    try:
        child.expect(PROMPT)
        child.sendline("%fleet help")
        child.expect("%fleet attach")
        child.expect(PROMPT)
        child.sendline("count to three")
        child.expect("iteration 1/")
        child.expect("tick 2")
        child.expect(r"Out\[\d+\]:")
        child.expect("counted to three")
        child.expect(PROMPT)
        child.sendline("a sleepy task")
        child.expect("sleeping")
        child.sendintr()
        child.expect("TurnCancelled")
        child.expect(PROMPT)
        child.sendline("exit")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)
    assert "Traceback" not in screen.getvalue() and "Out[" in screen.getvalue()
    counted = screen.getvalue().split("count to three", 1)[1].split("a sleepy task", 1)[0]
    assert counted.count("── completed") == 1, counted  # the summary line once, then Out[n]: the answer
    for shown in ("reasoning: count slowly", "time.sleep(0.2)", "tick 2", "Out["):
        assert counted.count(shown) == 1, (shown, counted)  # each step once: the text is rendered from the view
