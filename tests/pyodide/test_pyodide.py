"""The ``pyodide`` sandbox backend end to end: a real Deno + Pyodide worker, no mocks.

One interpreter (one ~3 s cold start) serves most tests; the dspy.RLM, TurnRunner and no-network
tests start their own. Skipped with the reason when Deno or the offline Pyodide cache is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, FinalOutput
from dspy.utils import DummyLM

from fleet_kernel.config import Limits, Policy, Settings, load_settings
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox import SandboxFactory, SandboxInterpreter, observer
from fleet_kernel.sandbox.pyodide import PREFETCH_COMMAND, find_cache, open_pyodide, probe_pyodide, snapshot_path

if (_missing := probe_pyodide()) is not None:
    pytest.skip(f"pyodide sandbox unavailable: {_missing}", allow_module_level=True)

EXEC_TIMEOUT_S = 3.0


def make_settings(home: Path, exec_timeout_s: float = EXEC_TIMEOUT_S) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=exec_timeout_s))
    return Settings(home=home, database_url="sqlite://", sandbox="pyodide", policy=policy)


class Recorder:
    """A SandboxObserver that timestamps what it is told."""

    def __init__(self) -> None:
        self.output: list[tuple[float, str]] = []
        self.tools: list[str] = []

    def on_output(self, stream: str, text: str) -> None:
        self.output.append((time.monotonic(), text))

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        self.tools.append(name)
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pyodide") / "workspace"
    (root / "files").mkdir(parents=True)
    (root / "files" / "data.csv").write_text("a,b\n1,2\n")
    return root


@pytest.fixture(scope="module")
def factory(workspace: Path) -> Iterator[SandboxFactory]:
    made = open_pyodide(make_settings(workspace.parent / "home"), workspace)
    yield made
    made.close()


@pytest.fixture(scope="module")
def interp(factory: SandboxFactory) -> SandboxInterpreter:
    interpreter = factory()
    interpreter.start()
    return interpreter


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    token = observer.set(rec)
    yield rec
    observer.reset(token)


@pytest.mark.slow
def test_execute_keeps_state_and_shows_last_expression(interp: SandboxInterpreter) -> None:
    assert interp.execute("x = 20") is None
    assert interp.execute("x + 1") == "21"
    assert interp.execute("print('hello')\nx * 2") == "hello\n40"
    assert interp.execute("import sys, os\nprint(sys.platform, os.getcwd())") == "emscripten /workspace"
    assert interp.execute("y = size * 2\ny", variables={"size": 4}) == "8"
    big = "é" * 1_500_000  # 3 MB of JSON: crosses the 1 MiB mailbox in several chunks
    assert interp.execute("len(big), big[-1]", variables={"big": big}) == "(1500000, 'é')"


def test_errors_keep_partial_output(interp: SandboxInterpreter) -> None:
    with pytest.raises(CodeExecutionError, match=r"(?s)partial.*ZeroDivisionError"):
        interp.execute("print('partial')\n1/0")
    with pytest.raises(SyntaxError):
        interp.execute("def (")


def test_output_streams_before_execute_returns(interp: SandboxInterpreter, recorder: Recorder) -> None:
    """The code asks the host (a tool) whether its first line arrived, and waits until it has."""
    interp.tools["arrived"] = lambda: any("first" in text for _, text in recorder.output)
    try:
        result = interp.execute(
            "import time\nprint('first')\nwaited = time.monotonic()\n"
            "while not arrived() and time.monotonic() - waited < 2.5:\n    time.sleep(0.05)\n"
            "print('arrived' if arrived() else 'never arrived')"
        )
    finally:
        del interp.tools["arrived"]
    assert result == "first\narrived"


@pytest.mark.slow
def test_output_buffered_mid_burst_is_flushed_while_code_runs(interp: SandboxInterpreter, recorder: Recorder) -> None:
    """Without threads the runtime flushes on a timer signal, so a burst followed by silence streams too."""
    code = "import time\nfor i in range(50):\n    print(i)\nt = time.monotonic()\nwhile time.monotonic() - t < 2.5:\n    pass"
    interp.execute(code)
    returned = time.monotonic()
    last = max(t for t, text in recorder.output if "49" in text)
    assert returned - last > 1, "the burst arrived only when the code ended"  # of a 2.5 s silence


def test_fd_level_output_is_captured(interp: SandboxInterpreter) -> None:
    assert interp.execute("import os\nos.write(1, b'raw\\n')\nprint('py')") == "raw\npy"


def test_tool_round_trip(interp: SandboxInterpreter, recorder: Recorder) -> None:
    def add(a: int, b: int = 0) -> int:
        if a < 0:
            raise ValueError("no negatives")
        return a + b

    interp.tools["add"] = add
    try:
        assert interp.execute("print(add(2, b=3))") == "5"
        with pytest.raises(CodeExecutionError, match="ValueError: no negatives"):
            interp.execute("add(-1)")
        assert (
            interp.execute("try:\n    add(-1)\nexcept ValueError as e:\n    print('caught', e)")
            == "caught no negatives"
        )
    finally:
        del interp.tools["add"]
    assert recorder.tools == ["add", "add", "add"]


def test_submit(interp: SandboxInterpreter) -> None:
    interp.output_fields = [{"name": "answer", "type": "str"}, {"name": "score", "type": "int"}]
    try:
        assert interp.execute("SUBMIT('yes', 3)") == FinalOutput({"answer": "yes", "score": 3})
        assert interp.execute("try:\n    SUBMIT(score=4, answer='no')\nexcept Exception:\n    pass") == FinalOutput(
            {"answer": "no", "score": 4}
        )
    finally:
        interp.output_fields = None


@pytest.mark.slow
@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_timeout_interrupts_and_keeps_state(interp: SandboxInterpreter, code: str) -> None:
    interp.execute("kept = 'still here'")
    started = time.monotonic()
    with pytest.raises(CodeExecutionError, match="timed out after 3 s and was interrupted"):
        interp.execute(code)
    assert time.monotonic() - started < 30  # liveness: the code never ends by itself
    assert interp.execute("kept") == "'still here'"


def test_interrupt_reaches_code_waiting_for_a_tool(interp: SandboxInterpreter) -> None:
    """The worker blocks in Atomics.wait for the tool's reply; an interrupt must wake it, and state stays."""
    release = threading.Event()
    interp.tools["wait"] = lambda: release.wait(30)
    timer = threading.Timer(0.5, interp.interrupt)
    try:
        interp.execute("kept = 'before the wait'")
        timer.start()
        started = time.monotonic()
        with pytest.raises(CodeExecutionError, match="KeyboardInterrupt"):
            interp.execute("wait()\nprint('never')")
        assert time.monotonic() - started < 20  # liveness: the tool waits 30 s
    finally:
        release.set()
        del interp.tools["wait"]
    assert interp.execute("kept") == "'before the wait'"


def test_workspace_files_in_artifacts_and_memory_out(interp: SandboxInterpreter, workspace: Path) -> None:
    assert interp.execute("print(open('/workspace/files/data.csv').read().split())") == "['a,b', '1,2']"
    interp.execute(
        textwrap.dedent("""
        import os
        os.makedirs('/workspace/artifacts/out', exist_ok=True)
        open('/workspace/artifacts/out/table.csv', 'w').write('x\\n1\\n')
        open('/workspace/artifacts/blob.bin', 'wb').write(bytes(range(256)))
        with open('/workspace/memory/MEMORIES.md', 'a') as f:
            f.write('- likes csv\\n')
        open('/workspace/files/scratch.txt', 'w').write('not synced back')
    """)
    )
    assert (workspace / "artifacts" / "out" / "table.csv").read_text() == "x\n1\n"
    assert (workspace / "artifacts" / "blob.bin").read_bytes() == bytes(range(256))
    assert (workspace / "memory" / "MEMORIES.md").read_text().endswith("- likes csv\n")
    assert not (workspace / "files" / "scratch.txt").exists()

    (workspace / "files" / "later.txt").write_text("added by the host")
    assert interp.execute("open('/workspace/files/later.txt').read()") == "'added by the host'"
    interp.execute("os.remove('/workspace/artifacts/blob.bin')")
    assert not (workspace / "artifacts" / "blob.bin").exists()


def test_deno_permissions_hold_against_code_that_reaches_js(interp: SandboxInterpreter, workspace: Path) -> None:
    """Sandboxed code can reach Deno through Pyodide's ``js`` module; Deno's permissions are the boundary."""
    other = workspace.parent / "other-session"
    other.mkdir(exist_ok=True)
    (other / "secret.txt").write_text("TOPSECRET")
    code = textwrap.dedent(f"""
        import js
        from pyodide.code import run_js
        attempts = [
            lambda: js.Deno.readTextFileSync('/etc/passwd'),
            lambda: js.Deno.readTextFileSync({str(other / "secret.txt")!r}),
            lambda: js.Deno.writeTextFileSync('/workspace/escape.txt', 'x'),
            lambda: js.Deno.env.toObject(),
            lambda: run_js("Deno.listen({{port: 0}})"),
            lambda: run_js("new Deno.Command('/bin/true').outputSync()"),
            lambda: run_js("Deno.dlopen('libc.so.6', {{}})"),
            lambda: js.Deno.hostname(),
        ]
        for attempt in attempts:
            try:
                attempt()
                print('allowed')
            except Exception as exc:
                print('denied' if 'NotCapable' in str(exc) else exc)
    """)
    assert interp.execute(code) == "\n".join(["denied"] * 8)
    assert not (workspace / "escape.txt").exists()


@pytest.mark.slow
def test_dspy_rlm_with_dummy_lm(workspace: Path) -> None:
    factory = open_pyodide(make_settings(workspace.parent / "home", exec_timeout_s=30), workspace)
    lm = DummyLM([
        {"reasoning": "Look first.", "code": "print(sum(range(10)))"},
        {"reasoning": "Done.", "code": "SUBMIT(answer=str(sum(range(10))))"},
    ])  # fmt: skip
    try:
        with dspy.context(lm=lm):
            result = dspy.RLM("question -> answer", max_iters=4, interpreter_factory=factory)(question="sum 0..9?")
    finally:
        factory.close()
    assert result.answer == "45"
    assert result.trajectory[0]["output"] == "45"


@pytest.mark.slow
def test_unusable_snapshot_falls_back_to_a_normal_start(tmp_path: Path) -> None:
    deno_dir = tmp_path / "deno"
    shutil.copytree(find_cache() or "", deno_dir, ignore=shutil.ignore_patterns("fleet"))
    snapshot_path(deno_dir).parent.mkdir()
    snapshot_path(deno_dir).write_bytes(b"not a snapshot")
    factory = open_pyodide(make_settings(tmp_path / "home"), tmp_path / "workspace", deno_dir=deno_dir)
    try:
        assert factory().execute("6 * 7") == "42"
    finally:
        factory.close()


def test_missing_cache_says_how_to_prefetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fleet_kernel.sandbox.pyodide.cache_candidates", lambda home=None: [tmp_path / "none"])
    with pytest.raises(SandboxUnavailableError, match=PREFETCH_COMMAND):
        open_pyodide(make_settings(tmp_path / "home"), tmp_path / "workspace")


def test_pyodide_is_the_fallback_where_bubblewrap_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_kernel import sandbox
    from fleet_kernel.sandbox import _probe

    monkeypatch.setattr(_probe, "probe_bwrap", lambda: "bubblewrap is not installed")
    settings = Settings(home=tmp_path / "home", database_url="sqlite://")
    factory = sandbox.open_sandbox(settings, tmp_path / "workspace")
    try:
        assert factory.backend == "pyodide" and "Pyodide" in factory.execution_instructions
    finally:
        factory.close()


NO_NETWORK_SCRIPT = """
import sys
from pathlib import Path
from fleet_kernel.config import Settings
from fleet_kernel.sandbox.pyodide import open_pyodide
factory = open_pyodide(Settings(home=Path(sys.argv[1]), database_url="sqlite://", sandbox="pyodide"), Path(sys.argv[2]))
try:
    print(factory().execute("import socket\\ntry:\\n    socket.create_connection(('1.1.1.1', 80), 2)\\nexcept OSError as e:\\n"
                            "    print('no network:', type(e).__name__)\\n6 * 7"))
finally:
    factory.close()
"""


@pytest.mark.slow
def test_works_with_no_network_at_all(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], check=False).returncode:
        pytest.skip("unshare -n (a private network namespace) is not permitted here")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", NO_NETWORK_SCRIPT, str(tmp_path / "home"), str(tmp_path / "workspace")],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["no network: OSError", "42"]


@pytest.mark.slow
async def test_turn_runner_with_pyodide(
    fleet_env: dict[str, str], store: Any, scripted_lm: Any, tmp_path: Path
) -> None:
    from scripted_lm import step

    from fleet_kernel.engine import TurnRunner

    scripted_lm.add("*", [
        step("Ask.", "print('sub says', llm_query('hi'))\nopen('/workspace/artifacts/a.txt', 'w').write('A')"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    runner = await TurnRunner(store, load_settings({**fleet_env, "FLEET_SANDBOX": "pyodide"})).open()
    try:
        session = await store.create_session()
        handle = await runner.start(session.session_id, "use pyodide")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    kinds = [e.type for e in events]
    assert events[0].data["sandbox"] == "pyodide"
    assert kinds[-1] == "turn.completed" and events[-1].data["answer"] == "ok", json.dumps(events[-1].data)
    assert "sub says sub-answer: hi" in "".join(e.data["text"] for e in events if e.type == "output")
    artifact = next(e for e in events if e.type == "artifact")
    assert artifact.data["path"] == "artifacts/a.txt"
