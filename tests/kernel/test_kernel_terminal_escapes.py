"""Sandbox output and model text with terminal control sequences reach a frontend inert (OSC 52, OSC 0, CSI)."""

from __future__ import annotations

import pytest
from kernel_harness import Kernel
from scripted_lm import step

CODE = (
    "print('\\x1b]52;c;ZXZpbA==\\x07')\nprint('\\x1b]0;pwned\\x07', flush=True)\n"
    "SUBMIT(answer='done \\x1b]0;pwned\\x07')"
)


@pytest.mark.parametrize("output", ["text", pytest.param("rich", marks=pytest.mark.slow)])
def test_control_sequences_are_shown_not_obeyed(kernel: Kernel, scripted_lm, output: str) -> None:
    scripted_lm.add("escapes", [step("clear the screen \x1b[2J\x1b[H", CODE)])
    assert kernel.run(f"%fleet output {output}").reply["content"]["status"] == "ok"
    run = kernel.run("print escapes")
    assert run.reply["content"]["status"] == "ok", run.reply
    shown = run.text()
    assert "\x1b" not in shown and "\x07" not in shown, shown
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "done \\x1b]0;pwned\\x07" in shown
    assert "\\x1b[2J" in shown
