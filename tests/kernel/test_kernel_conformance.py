"""jupyter_kernel_test conformance for FleetKernel: every message validated against the v5 schemas."""

from __future__ import annotations

import os
from typing import Any

import jupyter_kernel_test
from kernel_harness import KERNEL
from scripted_lm import ScriptedLM, step

# Every turn of this class runs in one session, and the scripted LM picks scripts by text found anywhere in
# the prompt (history included), so one step serves all: stdout, stderr, and an answer.
EVERY_TURN = step(
    "print and answer", "import sys\nprint('hello, world')\nprint('oh no', file=sys.stderr)\nSUBMIT(answer='forty-two')"
)


class FleetKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = KERNEL
    language_name = "markdown"
    file_extension = ".md"

    code_hello_world = "say hello"
    code_stderr = "complain"
    completion_samples = [{"text": "%fleet hel", "matches": {"help"}}]
    complete_code_samples = ["what is 2+2?", "%fleet help"]
    incomplete_code_samples = ["look:\n```python\nprint(1)", "a long line \\"]
    code_execute_result = [{"code": "answer forty-two", "mime": "text/markdown"}]
    code_display_data = [{"code": "%fleet help", "mime": "text/markdown"}]
    code_history_pattern = "answer*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "%fleet"
    code_clear_output = "say hello"
    code_generate_error = "%fleet frobnicate"

    lm: ScriptedLM
    saved: dict[str, str | None]

    def get_non_kernel_info_reply(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The library waits 15 s for a reply; a turn on a loaded machine (parallel workers) can take longer,
        so the wait is a liveness bound, not a speed check."""
        return super().get_non_kernel_info_reply(timeout=max(timeout or 0, 120))

    @classmethod
    def setUpClass(cls) -> None:
        import tempfile

        cls.home = tempfile.TemporaryDirectory()
        cls.lm = ScriptedLM(default=EVERY_TURN).start()
        env: dict[str, Any] = {"FLEET_HOME": cls.home.name, **cls.lm.env()}
        cls.saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the kernel is started by the base class with this process's environment
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls.lm.close()
        for key, value in cls.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cls.home.cleanup()
