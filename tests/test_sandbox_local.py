"""The ``local`` sandbox backend end to end: real bubblewrap workers, no mocks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, FinalOutput
from dspy.utils import DummyLM

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.errors import SandboxUnavailableError, TurnCancelled
from fleet_kernel.sandbox import SandboxFactory, _confine, observer, open_sandbox, probe_bwrap

needs_bwrap = pytest.mark.skipif(probe_bwrap() is not None, reason=f"local sandbox unavailable: {probe_bwrap()}")


def make_settings(tmp_path: Path, backend: str = "local", exec_timeout_s: float = 5, **sandbox: Any) -> Settings:
    policy = Policy(limits=Limits(exec_timeout_s=exec_timeout_s), sandbox=SandboxLimits(**sandbox))
    return Settings(home=tmp_path / "home", database_url="sqlite://", sandbox=backend, policy=policy)  # type: ignore[arg-type]


class Recorder:
    """A SandboxObserver that timestamps what it is told."""

    def __init__(self) -> None:
        self.output: list[tuple[float, str, str]] = []
        self.tools: list[tuple[str, Any]] = []

    def on_output(self, stream: str, text: str) -> None:
        self.output.append((time.monotonic(), stream, text))

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        self.tools.append(("start", (name, args, kwargs)))
        return f"call-{len(self.tools)}"

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        self.tools.append(("end", (call_id, ok, result)))


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[SandboxFactory]:
    if probe_bwrap() is not None:
        pytest.skip(f"local sandbox unavailable: {probe_bwrap()}")
    made = open_sandbox(make_settings(tmp_path), tmp_path / "workspace")
    yield made
    made.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    token = observer.set(rec)
    yield rec
    observer.reset(token)


def test_execute_keeps_state_and_shows_last_expression(factory: SandboxFactory) -> None:
    interp = factory()
    assert interp.execute("x = 20") is None
    assert interp.execute("x + 1") == "21"
    assert interp.execute("print('hello')\nx * 2") == "hello\n40"
    assert interp.execute("import os\nprint(os.getcwd(), os.getuid())") == "/workspace 65534"
    assert interp.execute("import io, sys\nsys.stdout = io.StringIO()\nprint('lost')") is None
    assert interp.execute("print('back')") == "back"  # each execute restores the captured streams


def test_submit_maps_positional_and_keyword_values(factory: SandboxFactory) -> None:
    interp = factory()
    interp.output_fields = [{"name": "answer", "type": "str"}, {"name": "score", "type": "int"}]
    assert interp.execute("SUBMIT('yes', 3)") == FinalOutput({"answer": "yes", "score": 3})
    assert interp.execute("try:\n    SUBMIT(score=4, answer='no')\nexcept Exception:\n    pass") == FinalOutput(
        {"answer": "no", "score": 4}
    )
    with pytest.raises(CodeExecutionError, match="missing"):
        interp.execute("SUBMIT(answer='only')")


def test_errors_keep_partial_output_and_syntax_errors_are_syntax_errors(factory: SandboxFactory) -> None:
    interp = factory()
    with pytest.raises(CodeExecutionError) as caught:
        interp.execute("print('partial')\ndef f():\n    raise ValueError('bad')\nf()")
    text = str(caught.value)
    assert text.startswith("partial\nTraceback") and "ValueError: bad" in text and "runtime" not in text
    with pytest.raises(SyntaxError, match="invalid syntax"):
        interp.execute("x = = 1")
    assert interp.execute("'still alive'") == "'still alive'"


def test_output_streams_to_the_observer_before_execute_returns(factory: SandboxFactory, recorder: Recorder) -> None:
    """The code asks the host (a tool) whether its first line arrived, and waits until it has."""
    interp = factory()
    interp.tools["arrived"] = lambda: any("tick" in text for _, _, text in recorder.output)
    result = interp.execute(
        "import time\nprint('tick')\nwaited = time.monotonic()\n"
        "while not arrived() and time.monotonic() - waited < 4:\n    time.sleep(0.02)\n"
        "print('arrived' if arrived() else 'never arrived')"
    )
    assert result == "tick\narrived"
    assert "".join(text for _, _, text in recorder.output) == result + "\n"


def test_fd_level_output_and_stderr_are_captured(factory: SandboxFactory, recorder: Recorder) -> None:
    interp = factory()
    out = interp.execute("import os, sys\nos.system('echo from-shell')\nprint('to-err', file=sys.stderr)")
    assert out == "from-shell\nto-err"
    assert {(stream, text) for _, stream, text in recorder.output} >= {("stdout", "from-shell\n")}
    assert any(stream == "stderr" for _, stream, _ in recorder.output)


def test_child_process_output_keeps_its_place_among_prints(factory: SandboxFactory) -> None:
    """What a child wrote before a ``print`` comes out before it, as on a terminal, even on a busy machine."""
    interp = factory()
    code = (
        "import os, sys\nfor i in range(300):\n    os.system(f'echo shell-{i}')\n    print(f'py-{i}', file=sys.stderr)"
    )
    expected = "\n".join(f"shell-{i}\npy-{i}" for i in range(300))
    assert interp.execute(code) == expected


def test_tools_round_trip_with_context_and_errors(factory: SandboxFactory, recorder: Recorder) -> None:
    interp = factory()
    seen_observer: list[Any] = []

    def lookup(key: str, *, default: str = "?") -> dict[str, str]:
        seen_observer.append(observer.get())
        return {"key": key, "value": default}

    def broken() -> None:
        raise ValueError("tool exploded")

    async def slow_double(n: int) -> int:
        await asyncio.sleep(0.01)
        return n * 2

    interp.tools.update(lookup=lookup, broken=broken, slow_double=slow_double)
    assert interp.execute("lookup('a', default='b')") == "{'key': 'a', 'value': 'b'}"
    assert seen_observer == [recorder]
    caught = interp.execute("try:\n    broken()\nexcept ValueError as e:\n    print('caught', e)")
    assert caught == "caught tool exploded"
    assert interp.execute("slow_double(21)") == "42"
    assert [kind for kind, _ in recorder.tools] == ["start", "end"] * 3
    assert recorder.tools[0] == ("start", ("lookup", ("a",), {"default": "b"}))
    assert recorder.tools[3][1][1] is False


@pytest.mark.slow
@needs_bwrap
def test_timeout_interrupts_and_keeps_state(tmp_path: Path) -> None:
    factory = open_sandbox(make_settings(tmp_path, exec_timeout_s=1), tmp_path / "ws")
    try:
        interp = factory()
        interp.execute("kept = 'yes'")
        started = time.monotonic()
        with pytest.raises(CodeExecutionError, match="timed out after 1 s .*state is kept"):
            interp.execute("while True:\n    pass")
        assert time.monotonic() - started < 30  # liveness: the loop never ends by itself
        assert interp.execute("kept") == "'yes'"
        with pytest.raises(CodeExecutionError, match="sandbox was restarted"):
            interp.execute(
                "import time\nwhile True:\n    try:\n        time.sleep(5)\n    except KeyboardInterrupt:\n        pass"
            )
        with pytest.raises(CodeExecutionError, match="NameError"):
            interp.execute("kept")
    finally:
        factory.close()


def test_factory_interrupt_cancels_a_sleeping_step(factory: SandboxFactory) -> None:
    interp = factory()
    interp.execute("import time")
    timer = threading.Timer(0.3, factory.interrupt)
    timer.start()
    started = time.monotonic()
    with pytest.raises(TurnCancelled):
        interp.execute("time.sleep(60)")
    assert time.monotonic() - started < 30  # liveness: the step sleeps for a minute
    with pytest.raises(TurnCancelled):
        interp.execute("1")


def test_a_tool_cancelling_the_turn_stops_the_code(factory: SandboxFactory) -> None:
    def stop_turn() -> None:
        raise TurnCancelled("user pressed stop")

    interp = factory()
    interp.tools["stop_turn"] = stop_turn
    with pytest.raises(TurnCancelled, match="user pressed stop"):
        interp.execute("try:\n    stop_turn()\nexcept Exception:\n    pass\nimport time\ntime.sleep(30)")


def test_unchanged_variables_are_not_resent(factory: SandboxFactory) -> None:
    interp = factory()
    big = "x" * 1_000_000
    interp.execute("first = id(context)", variables={"context": big, "n": 1})
    assert interp.execute("id(context) == first", variables={"context": big, "n": 1}) == "True"
    assert interp.execute("context = 'rebound'", variables={"context": big, "n": 1}) is None
    assert interp.execute("len(context), n", variables={"context": big, "n": 2}) == "(1000000, 2)"
    assert interp.execute("len(context)", variables={"context": "short", "n": 2}) == "5"


@needs_bwrap
def test_output_is_capped(tmp_path: Path) -> None:
    factory = open_sandbox(make_settings(tmp_path, max_output_bytes=10_000), tmp_path / "ws")
    try:
        out = factory().execute("for i in range(100_000):\n    print(i)")
        assert len(out) < 10_200 and out.endswith("[output truncated: more than 10000 characters]")
    finally:
        factory.close()


SPIN_TWO_PROCESSES = """
import os, time
until = time.time() + 2.0
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.time() < until:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
times = os.times()
print(round(times.children_user + times.children_system, 2))
"""


@pytest.mark.slow
@needs_bwrap
def test_busy_processes_get_only_their_share_of_cores(tmp_path: Path) -> None:
    probe = _confine.Cgroup.create(64, 16, 0.5)
    if probe is None:
        pytest.skip("no writable cgroup hierarchy here (not root, no delegation)")
    probe.remove()
    factory = open_sandbox(make_settings(tmp_path, exec_timeout_s=30, cpu_cores=0.25), tmp_path / "ws")
    try:
        used = float(factory().execute(SPIN_TWO_PROCESSES).strip())
    finally:
        factory.close()
    # A quarter of a core for 2 s allows 0.5 s of CPU; uncapped, two spinning processes take up to 4 s.
    assert used < 1.0, f"two busy processes used {used} s of CPU in 2 s with cpu_cores = 0.25"


def test_rlm_runs_end_to_end_on_the_sandbox(factory: SandboxFactory) -> None:
    prompts: list[str] = []

    def sub_lm(prompt: str, **_: Any) -> list[str]:
        prompts.append(prompt)
        return ["forty-two"]

    steps = [
        {"reasoning": "ask", "code": "```python\nreply = llm_query('what is six times seven?')\nprint(reply)\n```"},
        {"reasoning": "done", "code": "```python\nSUBMIT(answer=reply.upper())\n```"},
    ]
    rlm = dspy.RLM("question -> answer", max_iters=4, sub_lm=sub_lm, interpreter_factory=factory)
    with dspy.context(lm=DummyLM(steps)):
        result = rlm(question="six times seven?")
    assert result.answer == "FORTY-TWO"
    assert prompts == ["what is six times seven?"]
    assert "forty-two" in result.trajectory[0]["output"]
    assert factory.interpreters == []  # RLM shut down the interpreter it made


def test_facade_is_installed_in_the_sandbox(factory: SandboxFactory) -> None:
    from dspy.primitives.facade import FacadeInvocation

    interp = factory()
    FacadeInvocation({}, factory, None).install(interp)
    assert interp.execute("import dspy\ntype(dspy).__name__, hasattr(dspy, 'Predict')") == "('module', True)"


def test_unsafe_local_runs_without_bwrap(tmp_path: Path) -> None:
    factory = open_sandbox(make_settings(tmp_path, backend="unsafe-local"), tmp_path / "ws")
    try:
        interp = factory()
        assert interp.execute("import os\nos.getcwd()") == repr(str((tmp_path / "ws").absolute()))
        assert "directly on the host" in factory.execution_instructions
    finally:
        factory.close()


def test_unsafe_local_code_runs_under_the_rlimits_and_the_sandbox_user_limits(tmp_path: Path) -> None:
    """The limits are set by exec (prlimit) in the child, not by a preexec_fn that can deadlock the fork."""
    factory = open_sandbox(make_settings(tmp_path, backend="unsafe-local", cpu_seconds=17), tmp_path / "ws")
    try:
        interp = factory()
        limits = interp.execute(
            "import resource\nresource.getrlimit(resource.RLIMIT_CPU), resource.getrlimit(resource.RLIMIT_CORE)"
        )
        assert limits == "((17, 22), (0, 0))"
    finally:
        factory.close()


def test_local_without_bwrap_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_kernel.sandbox import _probe

    monkeypatch.setattr(_probe, "probe_bwrap", lambda: "bubblewrap is not installed: apt-get install bubblewrap")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap.*FLEET_SANDBOX=unsafe-local"):
        open_sandbox(make_settings(tmp_path), tmp_path / "ws")


def test_workspace_layout_and_instructions(factory: SandboxFactory, tmp_path: Path) -> None:
    assert {p.name for p in (tmp_path / "workspace").iterdir()} >= {"files", "artifacts", "memory"}
    assert "working directory is /workspace" in factory.execution_instructions
    assert "memory/MEMORIES.md" in factory.execution_instructions
    interp = factory()
    interp.execute("open('artifacts/out.txt', 'w').write('made inside')")
    interp.shutdown()  # the sandbox works on a copy, saved back when it stops
    assert (tmp_path / "workspace" / "artifacts" / "out.txt").read_text() == "made inside"
