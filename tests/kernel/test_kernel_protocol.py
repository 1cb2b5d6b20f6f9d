"""Tests for FleetKernel over ZMQ: what a Jupyter frontend sees for turns, commands and interrupts."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from kernel_harness import Kernel
from scripted_lm import step

from fleet_kernel.kernel.display import TOKEN_FLUSH_S
from fleet_kernel.store import Store

TICKS = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"


def store_turns(fleet_home: Path, session_id: str | None = None) -> list:
    """The turns in the store of ``fleet_home``: of ``session_id``, or of every session."""

    async def read() -> list:
        store = await Store.open(f"sqlite+aiosqlite:///{fleet_home / 'fleet.db'}")
        try:
            sessions = [session_id] if session_id else [s.session_id for s in await store.list_sessions()]
            return [t for s in sessions for t in await store.list_turns(s)]
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_kernel_info_is_markdown_without_debugger_or_subshells(kernel: Kernel) -> None:
    info = kernel.kc.kernel_info(reply=True)["content"]
    assert info["implementation"] == "fleet"
    assert info["language_info"]["name"] == "markdown"
    assert info["supported_features"] == []


@pytest.mark.slow
def test_a_turn_streams_then_ends_with_one_transcript(kernel: Kernel, scripted_lm) -> None:
    scripted_lm.add("count", [step("count slowly", TICKS), step("done", "SUBMIT(answer='counted **4**')")])
    run = kernel.run("count to four")
    assert run.reply["content"]["status"] == "ok"
    types = run.types
    assert run.states == [("busy", 0), ("idle", len(types))]  # busy, every output, idle: all for this request
    assert types[0] == "execute_input" and types[-1] == "execute_result"
    assert types.count("execute_result") == 1 and "clear_output" in types
    ticks = [i for i, m in enumerate(run.messages) if m["msg_type"] == "stream" and "tick 0" in m["content"]["text"]]
    # the code's output arrived while it ran, well before the turn ended
    assert ticks and run.times[-1] - run.times[ticks[0]] > 0.6
    result = run.result
    assert set(result["data"]) >= {"text/markdown", "text/html", "text/plain"}
    assert "counted **4**" in result["data"]["text/markdown"] and "<strong>4</strong>" in result["data"]["text/html"]
    assert "tick 3" in result["data"]["text/plain"]
    fleet = result["metadata"]["fleet"]
    (turn,) = store_turns(kernel.home, kernel.session_id())
    assert fleet == {
        "session_id": turn.session_id,
        "turn_id": turn.turn_id,
        "status": "completed",
        "model": "openai/scripted",
    }
    assert turn.status == "completed" and turn.task == "count to four"


@pytest.mark.slow
def test_interrupt_cancels_the_turn_and_the_kernel_lives_on(start_kernel, scripted_lm, fleet_home: Path) -> None:
    kernel = start_kernel()
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy task")
    kernel.wait_for_output(msg_id, "sleeping")
    started = time.monotonic()
    kernel.km.interrupt_kernel()
    run = kernel.collect(msg_id, timeout=30)
    assert time.monotonic() - started < 30  # liveness: the code sleeps for a minute
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == "TurnCancelled"
    (error,) = run.of("error")
    assert "Traceback" not in " ".join(error["traceback"])
    assert run.result["metadata"]["fleet"]["status"] == "cancelled"
    assert kernel.km.is_alive()
    assert [t.status for t in store_turns(fleet_home)] == ["cancelled"]
    scripted_lm.add("again", [step("done", "SUBMIT(answer='back again')")])
    again = kernel.run("again please")
    assert again.reply["content"]["status"] == "ok" and "back again" in again.result["data"]["text/plain"]


@pytest.mark.slow
def test_exit_and_quit_ask_the_console_to_leave(kernel: Kernel, scripted_lm) -> None:
    for word in ("exit", "quit"):
        run = kernel.run(word)
        assert run.reply["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]
    assert scripted_lm.requests == []


def test_silent_requests_never_call_the_lm(kernel: Kernel, scripted_lm) -> None:
    run = kernel.run("summarise the universe", silent=True)
    assert run.reply["content"]["status"] == "ok" and run.messages == []
    assert scripted_lm.requests == [] and "No session yet" in kernel.run("%fleet session").text()
    assert "summarise the universe" not in [t.task for t in store_turns(kernel.home)]


@pytest.mark.slow
def test_no_model_configured_is_a_readable_error(start_kernel, fleet_home: Path) -> None:
    kernel = start_kernel(FLEET_LM_MODEL="")
    run = kernel.run("hello?")
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == "TurnFailed"
    assert "FLEET_LM_MODEL" in content["evalue"]
    assert "Traceback" not in run.text() and "FLEET_LM_MODEL" in run.text()


@pytest.mark.slow
def test_completion_of_commands_and_session_ids(kernel: Kernel, scripted_lm) -> None:
    reply = kernel.kc.complete("%fleet se", 9, reply=True)["content"]
    assert reply["matches"] == ["session", "serve", "set"] and reply["cursor_start"] == 7
    kernel.run("%fleet session new notes")
    session_id = kernel.run("%fleet session").text().split()[1].rstrip(":")
    code = "%fleet session use ses_"
    reply = kernel.kc.complete(code, len(code), reply=True)["content"]
    assert session_id in reply["matches"]


@pytest.mark.slow
def test_is_complete_waits_for_open_fences_and_backslashes(kernel: Kernel) -> None:
    def status(code: str) -> str:
        msg_id = kernel.kc.is_complete(code)
        while (reply := kernel.kc.get_shell_msg(timeout=10))["parent_header"].get("msg_id") != msg_id:
            pass
        return reply["content"]["status"]

    assert status("what is 2+2?") == "complete"
    assert status("look at this:\n```python\nx = 1") == "incomplete"
    assert status("a long line \\") == "incomplete"


@pytest.mark.slow
def test_history_comes_from_the_store(kernel: Kernel, scripted_lm) -> None:
    scripted_lm.add("remember", [step("done", "SUBMIT(answer='ok')")])
    kernel.run("remember the milk")
    msg_id = kernel.kc.history(hist_access_type="tail", n=10, output=False, raw=True)
    reply = kernel.kc.get_shell_msg(timeout=10)
    assert reply["parent_header"]["msg_id"] == msg_id
    entries = reply["content"]["history"]  # every session's tasks, this kernel's session numbered 0
    assert entries[-1][0] == 0 and entries[-1][2] == "remember the milk"
    assert [h[2] for h in entries if h[0] == 0] == ["remember the milk"]


@pytest.mark.slow
def test_text_mode_streams_everything_as_text(start_kernel, scripted_lm) -> None:
    kernel = start_kernel(FLEET_OUTPUT="text")
    scripted_lm.add("count", [step("count slowly", TICKS), step("done", "SUBMIT(answer='four')")])
    run = kernel.run("count to four")
    assert set(run.types) == {"execute_input", "stream", "execute_result"}
    text = "".join(c["text"] for c in run.of("stream"))
    assert "iteration 1/" in text and "count slowly" in text and "tick 3" in text
    assert run.result["data"]["text/plain"].rstrip().endswith("four")


@pytest.mark.slow
def test_a_command_error_is_one_readable_error(kernel: Kernel) -> None:
    run = kernel.run("%fleet frobnicate")
    assert run.types == ["execute_input", "error"]
    assert run.reply["content"]["evalue"] == "unknown command %fleet frobnicate: see %fleet help"


@pytest.mark.slow
def test_updates_are_throttled_and_the_last_state_arrives(kernel: Kernel, scripted_lm) -> None:
    chatty = "import time\nfor i in range(200):\n    print('line', i, flush=True)\n    time.sleep(0.01)"
    scripted_lm.add("chatty", [step("print a lot", chatty), step("done", "SUBMIT(answer='done')")])
    run = kernel.run("a chatty task")
    # when the kernel sent each (its header's date), not when this busy client got round to reading it
    live = [m["header"]["date"].timestamp() for m in run.messages if m["msg_type"] != "execute_input"]
    per_second = max(sum(1 for t in live if start <= t < start + 1) for start in live)
    # one flush at most every TOKEN_FLUSH_S while the reply's tokens stream in (then every 0.25 s), each a
    # display update and a stream message: far from the 200 prints of 2 s, each sent as it came
    assert per_second <= 2 * round(1 / TOKEN_FLUSH_S), per_second
    text = "".join(c["text"] for c in run.of("stream"))
    assert "line 0\n" in text and "line 199\n" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "ename", "needle"),
    [
        ({"FLEET_LM_BASE_URL": "http://127.0.0.1:9/v1"}, "TurnFailed", "FLEET_LM_BASE_URL"),
        ({"FLEET_SANDBOX": "daytona"}, "TurnFailed", "Daytona"),
        ({"FLEET_SANDBOX": "nowhere"}, "ConfigError", "FLEET_SANDBOX"),
    ],
    ids=["provider-down", "sandbox-unavailable", "bad-config"],
)
def test_setup_errors_are_readable_without_tracebacks(
    start_kernel, env: dict[str, str], ename: str, needle: str
) -> None:
    kernel = start_kernel(**env)
    run = kernel.run("hello?")
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == ename
    assert needle in content["evalue"], content["evalue"]
    assert "Traceback" not in run.text()
    assert kernel.run("%fleet help").reply["content"]["status"] == "ok"  # and the kernel carries on


@pytest.mark.slow
def test_a_sigint_to_the_kernel_also_cancels_the_turn(start_kernel, scripted_lm) -> None:
    """The safety net for frontends that still signal (interrupt_mode "signal", a stray Ctrl-C)."""
    kernel = start_kernel()
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy task")
    kernel.wait_for_output(msg_id, "sleeping")
    os.kill(kernel.km.provisioner.pid, signal.SIGINT)
    run = kernel.collect(msg_id, timeout=15)
    assert run.reply["content"]["ename"] == "TurnCancelled"
    assert kernel.km.is_alive() and kernel.run("%fleet help").reply["content"]["status"] == "ok"


@pytest.mark.slow
def test_shutting_down_mid_turn_records_the_turn_cancelled(start_kernel, scripted_lm, fleet_home: Path) -> None:
    kernel = start_kernel()
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = kernel.submit("a sleepy task")
    kernel.wait_for_output(msg_id, "sleeping")
    kernel.km.shutdown_kernel(now=False)
    assert [t.status for t in store_turns(fleet_home)] == ["cancelled"]


@pytest.mark.slow
@pytest.mark.parametrize(("n", "mode"), [(1000, "text"), (10, "plain")], ids=["console", "lab"])
def test_a_terminal_asking_for_its_history_gets_text_output(kernel: Kernel, n: int, mode: str) -> None:
    """jupyter console loads 1000 history entries before its first cell; JupyterLab asks for 10."""
    msg_id = kernel.kc.history(hist_access_type="tail", n=n, output=False, raw=True)
    while kernel.kc.get_shell_msg(timeout=10)["parent_header"].get("msg_id") != msg_id:
        pass
    assert f"({mode})" in kernel.run("%fleet output").text()


@pytest.mark.slow
def test_an_unwritable_home_is_a_readable_error(start_kernel, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where FLEET_HOME should be")
    kernel = start_kernel(FLEET_HOME=str(blocked))
    run = kernel.run("hello?")
    assert run.reply["content"]["status"] == "error" and "Traceback" not in run.text()
    assert run.reply["content"]["ename"] == "ConfigError" and "set FLEET_HOME" in run.reply["content"]["evalue"]
