"""``%load_ext fleet_kernel`` in a stock python3 ipykernel, driven over ZMQ: turns next to Python cells."""

from __future__ import annotations

import os
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel
from kernel_harness import Kernel
from scripted_lm import step


class PythonKernel(Kernel):
    """A real ``python3`` ipykernel (this venv's) on the test's store and scripted LM."""

    def __init__(self, env: dict[str, str]) -> None:
        self.km, self.kc = start_new_kernel(kernel_name="python3", env={**os.environ, **env}, startup_timeout=60)

    def ok(self, code: str, timeout: float = 90) -> Any:
        run = self.run(code, timeout=timeout)
        assert run.reply["content"]["status"] == "ok", run.text()
        return run

    def value(self, expression: str) -> str:
        reply = self.kc.execute_interactive(
            "", user_expressions={"v": expression}, timeout=30, output_hook=lambda _msg: None
        )
        found = reply["content"]["user_expressions"]["v"]
        assert found["status"] == "ok", found
        return found["data"]["text/plain"]


@pytest.fixture
def py(fleet_env: dict[str, str]) -> Any:
    kernel = PythonKernel(fleet_env)
    kernel.ok("%load_ext fleet_kernel")
    yield kernel
    kernel.close()


def test_help_and_a_turn_with_a_dataframe_and_a_10_mb_string(py: PythonKernel, scripted_lm) -> None:
    assert "%fleet session" in py.ok("%fleet help").text()
    py.ok("import pandas as pd\ndf = pd.DataFrame({'city': ['a', 'b', 'c'], 'n': [1, 2, 39]})\nbig = 'x' * 10_000_000 + 'END'")
    scripted_lm.add("count", [
        step("look", "print('rows', len(df), 'sum', int(df['n'].sum()), type(df).__name__, flush=True)\n"
                     "print('big', len(big), big[-3:])"),
        step("done", "SUBMIT(answer=f\"total {int(df['n'].sum())} and {len(big)}\")"),
    ])
    run = py.ok("%%fleet --in df,big --out answer\ncount the rows")
    text = run.text()
    assert "rows 3 sum 42 DataFrame" in text and "big 10000003 END" in text
    assert "total 42 and 10000003" in run.result["data"]["text/plain"]
    assert py.value("answer") == repr("total 42 and 10000003")
    # the values reached the prompt only as a preview, never whole
    prompts = [str(r) for r in scripted_lm.requests]
    assert all(len(p) < 200_000 for p in prompts)
    assert any("DataFrame" in p and "3 rows x 2 columns" in p for p in prompts)


def test_streams_before_the_reply_and_later_cells_continue_the_session(py: PythonKernel, scripted_lm) -> None:
    scripted_lm.add("first", [step("say", "print('first line', flush=True)"), step("done", "SUBMIT(answer='one')")])
    msg_id = py.submit("%%fleet\nfirst task")
    seen = py.wait_for_output(msg_id, "first line")
    assert not any(m["msg_type"] == "execute_result" for m in seen)
    run = py.collect(msg_id, timeout=90)
    assert run.reply["content"]["status"] == "ok"
    assert run.result["metadata"]["fleet"]["status"] == "completed"
    session = run.result["metadata"]["fleet"]["session_id"]
    scripted_lm.add("second", [step("done", "SUBMIT(answer='two')")])
    again = py.ok("%%fleet\nsecond task")
    assert again.result["metadata"]["fleet"]["session_id"] == session
    assert session in py.ok("%fleet session").text()
    py.ok("%fleet session new fresh")
    scripted_lm.add("third", [step("done", "SUBMIT(answer='three')")])
    third = py.ok("%%fleet\nthird task")
    assert third.result["metadata"]["fleet"]["session_id"] != session


def test_interrupt_cancels_the_turn_and_python_lives_on(py: PythonKernel, scripted_lm) -> None:
    py.ok("kept = 41")
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = py.submit("%%fleet --out never\na sleepy task")
    py.wait_for_output(msg_id, "sleeping")
    py.km.interrupt_kernel()
    run = py.collect(msg_id, timeout=30)
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == "TurnCancelled", content
    assert run.result["metadata"]["fleet"]["status"] == "cancelled"
    assert py.km.is_alive()
    assert py.value("kept + 1") == "42"
    assert py.value("'never' in globals()") == "False"
    scripted_lm.add("again", [step("done", "SUBMIT(answer='back again')")])
    assert "back again" in py.ok("%%fleet\nagain please").result["data"]["text/plain"]


def test_bad_options_and_unknown_names_say_what_to_do(py: PythonKernel, scripted_lm) -> None:
    run = py.run("%%fleet --in nowhere\ntask")
    assert run.reply["content"]["ename"] == "NameError" and "nowhere" in run.reply["content"]["evalue"]
    run = py.run("%%fleet --frobnicate\ntask")
    assert run.reply["content"]["ename"] == "UsageError"
    py.ok("import threading\nlock = threading.Lock()")
    run = py.run("%%fleet --in lock\ntask")
    assert run.reply["content"]["ename"] == "ValidationError" and "lock is a lock" in run.reply["content"]["evalue"]
    assert "Traceback" not in run.text()
    assert scripted_lm.requests == []
