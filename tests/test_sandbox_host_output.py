"""What a sandbox's output can do to the host: its memory, the last words before a crash, and the terminal.

Real sandboxes (``local`` under bubblewrap; ``pyodide`` where Deno and the Pyodide cache are there), real turns
on the scripted LM, the real kernel over ZMQ. Each test reproduces an attack first seen to work.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError
from scripted_lm import step

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import SandboxFactory, observer, open_sandbox, probe_bwrap
from fleet_kernel.transcript import render_text, session_notebook, transcript_bundle, turn_view

MiB = 1024 * 1024

# The worker's own end of the protocol channel (a pipe fd it inherited), as in test_sandbox_hostile.
CHANNEL_FD = (
    "import gc, io\n"
    "fd = min(f.fileno() for f in gc.get_objects() if isinstance(f, io.BufferedWriter) and f.fileno() > 2)\n"
)


def unavailable(backend: str) -> str | None:
    if backend == "local":
        return probe_bwrap()
    from fleet_kernel.sandbox.pyodide import probe_pyodide

    return probe_pyodide()


def open_backend(backend: str, tmp_path: Path) -> SandboxFactory:
    if (reason := unavailable(backend)) is not None:
        pytest.skip(f"{backend} sandbox unavailable: {reason}")
    policy = Policy(limits=Limits(exec_timeout_s=20), sandbox=SandboxLimits(memory_mb=512, max_processes=32))
    settings = Settings(home=tmp_path / "home", database_url="sqlite://", sandbox=backend, policy=policy)
    return open_sandbox(settings, tmp_path / "workspace")


class Heard:
    """A SandboxObserver keeping what the host passed on, in order, with the crash that followed."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def on_output(self, stream: str, text: str) -> None:
        self.log.append(("output", text))

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass

    def output(self) -> str:
        return "".join(text for kind, text in self.log if kind == "output")


@pytest.fixture
def heard() -> Iterator[Heard]:
    recorder = Heard()
    token = observer.set(recorder)
    yield recorder
    observer.reset(token)


# -- 1. host memory ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_forged_lines_between_executions_do_not_grow_the_host(tmp_path: Path) -> None:
    """A background process flooding the protocol channel while no code runs: the host used to queue every line
    (68 MB to 1.1 GB of RSS in 8 s, kept after the turn). Now it reads nothing it is not waiting for. Lines stay
    under PIPE_BUF, so the writes are atomic and the runtime's own messages never land inside one."""
    factory = open_backend("local", tmp_path)
    try:
        interp = factory()
        flood = CHANNEL_FD + (
            'line = b\'{"type": "out", "stream": "stdout", "text": "\' + b\'f\' * 4000 + b\'"}\\n\'\n'
            "if os.fork() == 0:\n"
            "    end = time.monotonic() + 6\n"
            "    while time.monotonic() < end:\n"
            "        os.write(fd, line)\n"
            "    os._exit(0)\n"
            "'flooding'"
        )
        assert interp.execute(f"import os, time\n{flood}") == "'flooding'"
        host = psutil.Process()
        before = peak = host.memory_info().rss
        end = time.monotonic() + 5
        while time.monotonic() < end:
            peak = max(peak, host.memory_info().rss)
            time.sleep(0.1)
        assert peak - before < 200 * MiB, f"the host grew by {(peak - before) // MiB} MiB"
        assert interp.execute("1 + 1") == "2"  # what piled up in the pipe is read and skipped
        assert host.memory_info().rss - before < 200 * MiB
    finally:
        factory.close()


# -- 2. the last words before a crash ----------------------------------------------------------------------


LAST_WORDS = {
    "segfault": "import ctypes\nctypes.string_at(0)",
    "os._exit": "import os\nos._exit(3)",
    "SIGKILL": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("death", list(LAST_WORDS))
def test_flushed_output_before_a_crash_reaches_the_host(tmp_path: Path, heard: Heard, death: str) -> None:
    factory = open_backend("local", tmp_path)
    try:
        interp = factory()
        with pytest.raises(CodeExecutionError, match="It was restarted") as failure:
            interp.execute(f"print('last words', flush=True)\n{LAST_WORDS[death]}")
        assert heard.output() == "last words\n", heard.log
        assert str(failure.value).startswith("last words\n"), failure.value
        assert interp.execute("1 + 1") == "2"
    finally:
        factory.close()


def test_flushed_output_before_exit_reaches_the_host_in_pyodide(tmp_path: Path, heard: Heard) -> None:
    factory = open_backend("pyodide", tmp_path)
    try:
        interp = factory()
        with pytest.raises(CodeExecutionError, match="It was restarted") as failure:
            interp.execute("import os\nprint('last words', flush=True)\nos._exit(3)")
        assert heard.output() == "last words\n", heard.log
        assert str(failure.value).startswith("last words\n"), failure.value
    finally:
        factory.close()


# -- 3. terminal escapes -------------------------------------------------------------------------------

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: sets the clipboard to "evil"
TITLE = "\x1b]0;pwned\x07"  # OSC 0: sets the window title
ESCAPES_CODE = f"print({CLIPBOARD!r})\nprint({TITLE!r}, flush=True)\nSUBMIT(answer={'done ' + TITLE!r})"


def escaping_turn(scripted_lm: Any) -> None:
    scripted_lm.add("escapes", [step("clear the screen \x1b[2J\x1b[H and ring \x07", ESCAPES_CODE)])


def inert(value: Any) -> bool:
    """No ESC, BEL or C1 introducer in any string of ``value`` (JSON would only hide them as \\u escapes)."""
    if isinstance(value, dict):
        return all(inert(v) for v in value.values())
    if isinstance(value, list):
        return all(inert(v) for v in value)
    return not isinstance(value, str) or not any(c in value for c in "\x1b\x07\x9b\x9d")


async def test_terminal_escapes_never_reach_events_or_exports(runner: Any, store: Any, scripted_lm: Any) -> None:
    escaping_turn(scripted_lm)
    session = await store.create_session()
    handle = await runner.start(session.session_id, "print escapes")
    events = [event async for event in handle.events()]
    assert events[-1].type == "turn.completed", events[-1]
    stored = await store.events_after(events[0].turn_id)
    for event in stored:
        assert inert(event.data), event
    printed = "".join(e.data["text"] for e in stored if e.type == "output")
    assert printed == "\\x1b]52;c;ZXZpbA==\\x07\n\\x1b]0;pwned\\x07\n"  # visible, and inert
    assert events[-1].data["answer"] == "done \\x1b]0;pwned\\x07"
    reasoning = next(e.data["text"] for e in stored if e.type == "reasoning")
    assert reasoning == "clear the screen \\x1b[2J\\x1b[H and ring \\x07"
    view = await turn_view(store, await store.get_turn(events[0].turn_id))
    data, _ = transcript_bundle(view)
    assert all(inert(text) for text in data.values()) and "pwned" in render_text(view)
    notebook = await session_notebook(store, session.session_id)
    assert inert(json.loads(nbformat.writes(notebook))), notebook


async def test_last_words_are_an_output_event_before_the_crash_is_reported(
    runner: Any, store: Any, scripted_lm: Any
) -> None:
    scripted_lm.add(
        "crash",
        [
            step("die", "print('last words', flush=True)\nimport ctypes\nctypes.string_at(0)"),
            step("done", "SUBMIT(answer='ok')"),
        ],
    )
    session = await store.create_session()
    handle = await runner.start(session.session_id, "crash the sandbox")
    events = [event async for event in handle.events()]
    kinds = [(e.type, e.data.get("text")) for e in events if e.type in ("output", "execution.finished")]
    assert kinds[:2] == [("output", "last words\n"), ("execution.finished", None)], kinds
    finished = next(e for e in events if e.type == "execution.finished")
    assert "segmentation fault" in finished.data["error"]["message"]
    assert events[-1].type == "turn.completed"


@pytest.mark.slow
def test_forged_tool_calls_do_not_start_a_host_thread_each(tmp_path: Path) -> None:
    """Each tool call runs on a host thread; forged calls written to the channel used to start one thread each."""
    factory = open_backend("local", tmp_path)
    try:
        interp = factory()
        interp.start()  # on this thread: bwrap's --die-with-parent kills the sandbox when the starting thread ends
        release = threading.Event()
        interp.tools["slow"] = lambda: release.wait(30)
        forge = CHANNEL_FD + (
            "import os\n"
            "for i in range(10_000, 12_000):\n"
            '    call = \'{"type": "tool_call", "id": %d, "name": "slow", "args": [], "kwargs": {}}\\n\'\n'
            "    os.write(fd, (call % i).encode())\n"
            "slow()\n'done'"
        )
        before, peak = threading.active_count(), 0
        outcome: list[str] = []

        def execute() -> None:
            try:
                outcome.append(interp.execute(forge))
            except CodeExecutionError as exc:
                outcome.append(str(exc))

        worker = threading.Thread(target=execute, daemon=True)
        worker.start()
        end = time.monotonic() + 3
        while time.monotonic() < end:
            peak = max(peak, threading.active_count())
            time.sleep(0.05)
        release.set()
        worker.join(30)
        assert peak - before < 100, f"{peak - before} host threads"
        assert outcome == ["'done'"] or "tool calls at once" in outcome[0], outcome  # its own call may be refused
        assert interp.execute("1 + 1") == "2"
    finally:
        factory.close()
