"""Tests for fleet_kernel.sandbox.daytona: the backend on the real SDK against the loopback fake Daytona."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dspy.primitives.code_interpreter import CodeExecutionError, FinalOutput
from fake_server import FakeDaytona
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import SandboxUnavailableError
from fleet_kernel.sandbox import base, daytona
from fleet_kernel.sandbox._daytona_session import DaytonaSession
from fleet_kernel.workspace import Workspace


@pytest.fixture
def workspace(settings: Settings) -> Workspace:
    return Workspace.for_session(settings.workspaces_dir, "session-a")


class Recorder:
    """A ``SandboxObserver`` that notes when each chunk arrived."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, str]] = []

    def on_output(self, stream: str, text: str) -> None:
        self.chunks.append((time.perf_counter(), text))

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass


@pytest.mark.slow
def test_interpreter_runs_code_tools_and_submit(settings: Settings, workspace: Workspace) -> None:
    factory = daytona.open_daytona(settings, workspace.root)
    interp = factory()
    interp.tools["double"] = lambda x: x * 2
    interp.output_fields = [{"name": "answer", "type": "int"}]
    assert interp.execute("import os\nx = 20\nprint('x is', x, 'in', os.getcwd())") == "x is 20 in /workspace"
    assert interp.execute("double(x + 1)") == "42"  # a host tool, answered through the inbox
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        interp.execute("print('partial')\n1/0")
    with pytest.raises(SyntaxError):
        interp.execute("def (")
    assert interp.execute("SUBMIT(answer=x)") == FinalOutput({"answer": 20})
    child = factory()  # a child RLM: its own context in the same sandbox
    with pytest.raises(CodeExecutionError, match="NameError"):
        child.execute("x")
    factory.close()


@pytest.mark.slow
def test_output_streams_to_the_observer_while_code_runs(settings: Settings, workspace: Workspace) -> None:
    factory = daytona.open_daytona(settings, workspace.root)
    recorder = Recorder()
    token = base.observer.set(recorder)
    try:
        started = time.perf_counter()
        factory().execute("import time\nfor i in range(3):\n    print('tick', i)\n    time.sleep(0.3)")
        finished = time.perf_counter()
    finally:
        base.observer.reset(token)
        factory.close()
    assert "".join(text for _, text in recorder.chunks) == "tick 0\ntick 1\ntick 2\n"
    assert recorder.chunks[0][0] - started < finished - started - 0.4


@pytest.mark.slow
def test_big_values_cross_in_marker_pieces(settings: Settings, workspace: Workspace) -> None:
    factory = daytona.open_daytona(settings, workspace.root)
    interp = factory()
    interp.tools["echo"] = lambda text: text
    big = 'é"\\x' * 100_000  # 400 k characters that all need escaping
    assert interp.execute("len(echo(big))", variables={"big": big}) == "400000"
    out = interp.execute("print(big[:300000])")
    assert out == big[:300_000]
    factory.close()


@pytest.mark.slow
def test_timeout_interrupts_and_keeps_state(env: dict[str, str], tmp_path: Path, workspace: Workspace) -> None:
    (tmp_path / "fleet.toml").write_text("[limits]\nexec_timeout_s = 1\n")
    settings = load_settings({**env, "FLEET_CONFIG": str(tmp_path / "fleet.toml")})
    factory = daytona.open_daytona(settings, workspace.root)
    interp = factory()
    interp.execute("kept = 'yes'")
    started = time.perf_counter()
    with pytest.raises(CodeExecutionError, match="timed out after 1 s and was interrupted"):
        interp.execute("import time\nwhile True:\n    time.sleep(0.05)")
    assert time.perf_counter() - started < 30  # liveness: the loop never ends by itself
    assert interp.execute("kept") == "'yes'"
    with pytest.raises(CodeExecutionError, match="did not stop"):  # swallows every interrupt: a new context
        interp.execute(
            "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except BaseException:\n        pass"
        )
    with pytest.raises(CodeExecutionError, match="NameError"):
        interp.execute("kept")
    factory.close()


def test_daytona_run_deadline_4008_keeps_the_context(settings: Settings, workspace: Workspace) -> None:
    """Daytona's own per-run deadline (a backstop) interrupts with SIGINT; the context survives it."""
    box = daytona.acquire(settings, workspace.root)
    session = DaytonaSession(box, max_output_bytes=10_000, run_timeout_s=1)
    session.start()
    session.send({"type": "execute", "id": 1, "code": "kept = 1\nwhile True:\n    pass", "tools": []})
    done = _until_done(session, 1)
    assert done["kind"] == "interrupted"
    session.send({"type": "execute", "id": 2, "code": "kept + 1", "tools": []})
    assert _until_done(session, 2)["value"] == "2"
    session.kill()


def _until_done(session: DaytonaSession, exec_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = session.receive(0.1)
        if message is not None and message.get("type") == "done" and message.get("id") == exec_id:
            return message
    raise AssertionError("no done message")


def test_one_warm_sandbox_per_session(settings: Settings, workspace: Workspace, fake: FakeDaytona) -> None:
    for _ in range(2):
        factory = daytona.open_daytona(settings, workspace.root)
        factory().execute("print(1)")
        factory.close()
    assert len(fake.sandboxes) == 1
    sandbox = next(iter(fake.sandboxes.values()))
    assert sandbox.labels["fleet_session"] == "session-a"
    assert sandbox.labels["fleet_store"] == daytona.store_label(settings)
    assert sandbox.auto_stop_interval == daytona.AUTO_STOP_MIN and sandbox.env == {}
    assert [v["mountPath"] for v in sandbox.volumes] == ["/workspace"]
    assert sandbox.contexts == {}  # every interpreter's context was deleted when its turn ended
    other = Workspace.for_session(settings.workspaces_dir, "session-b")
    daytona.open_daytona(settings, other.root).close()
    assert len(fake.sandboxes) == 2


def test_stopped_sandboxes_restart_and_deleted_ones_are_replaced(
    settings: Settings, workspace: Workspace, client, fake: FakeDaytona
) -> None:
    factory = daytona.open_daytona(settings, workspace.root)
    factory().execute("open('/workspace/artifacts/kept.txt', 'w').write('on the volume')")
    factory.close()
    first = next(iter(fake.sandboxes))
    client.get(first).stop()  # Daytona's auto-stop between turns
    factory = daytona.open_daytona(settings, workspace.root)
    assert factory().execute("print(open('/workspace/artifacts/kept.txt').read())") == "on the volume"
    factory.close()
    assert list(fake.sandboxes) == [first] and fake.sandboxes[first].state == "started"
    client.delete(client.get(first), wait=True)
    factory = daytona.open_daytona(settings, workspace.root)
    assert factory().execute("print(open('/workspace/artifacts/kept.txt').read())") == "on the volume"
    factory.close()
    assert len(fake.sandboxes) == 1 and first not in fake.sandboxes


def test_workspace_syncs_both_ways(settings: Settings, workspace: Workspace) -> None:
    (workspace.root / "files" / "data.csv").write_text("a,b\n1,2\n")
    (workspace.root / "artifacts" / "old.txt").write_text("to be deleted by the code")
    factory = daytona.open_daytona(settings, workspace.root)
    interp = factory()
    assert interp.execute("print(open('/workspace/files/data.csv').read().split()[1])") == "1,2"
    interp.execute(
        "import os\nos.makedirs('/workspace/artifacts/plots', exist_ok=True)\n"
        "open('/workspace/artifacts/plots/p.txt', 'w').write('plot')\n"
        "os.remove('/workspace/artifacts/old.txt')\n"
        "open('/workspace/memory/MEMORIES.md', 'a').write('- learned\\n')"
    )
    factory.close()
    assert (workspace.root / "artifacts" / "plots" / "p.txt").read_text() == "plot"
    assert not (workspace.root / "artifacts" / "old.txt").exists()
    assert (workspace.root / "memory" / "MEMORIES.md").read_text().endswith("- learned\n")
    (workspace.root / "files" / "data.csv").write_text("changed locally\n")
    factory = daytona.open_daytona(settings, workspace.root)
    assert factory().execute("print(open('/workspace/files/data.csv').read())") == "changed locally"
    factory.close()


def test_stale_sandboxes_of_this_store_are_deleted_first(
    settings: Settings, workspace: Workspace, client, fake: FakeDaytona
) -> None:
    from daytona import CreateSandboxFromSnapshotParams as Params

    store = daytona.store_label(settings)
    stale = client.create(Params(language="python", labels={"fleet_store": store, "fleet_session": "old"}))
    stale.stop()
    running = client.create(Params(language="python", labels={"fleet_store": store, "fleet_session": "busy"}))
    foreign = client.create(Params(language="python", labels={"fleet_store": "another-store"}))
    foreign.stop()
    daytona.open_daytona(settings, workspace.root).close()
    assert stale.id not in fake.sandboxes
    assert running.id in fake.sandboxes and foreign.id in fake.sandboxes


@pytest.mark.parametrize(
    ("status", "code", "says"),
    [
        (401, "daytona_auth", "FLEET_DAYTONA_API_KEY"),
        (403, "daytona_quota", "quota"),
        (500, "daytona_error", "Daytona is failing"),
    ],
)
def test_failures_say_what_to_do(
    settings: Settings, workspace: Workspace, fake: FakeDaytona, status: int, code: str, says: str
) -> None:
    fake.fail("GET", "/api/sandbox", status, "nope", times=10)
    with pytest.raises(SandboxUnavailableError) as caught:
        daytona.open_daytona(settings, workspace.root)
    assert caught.value.code == code and says in caught.value.message


def test_rate_limits_are_retried(settings: Settings, workspace: Workspace, fake: FakeDaytona) -> None:
    fake.fail("GET", "/api/sandbox", 429, "slow down", times=2)
    daytona.open_daytona(settings, workspace.root).close()


def test_bad_key_missing_key_and_no_network(env: dict[str, str], workspace: Workspace) -> None:
    with pytest.raises(SandboxUnavailableError, match="rejected FLEET_DAYTONA_API_KEY") as caught:
        daytona.open_daytona(load_settings({**env, "FLEET_DAYTONA_API_KEY": "wrong"}), workspace.root)
    assert "wrong" not in caught.value.message
    with pytest.raises(SandboxUnavailableError, match="FLEET_DAYTONA_API_KEY is not set"):
        daytona.open_daytona(load_settings({**env, "FLEET_DAYTONA_API_KEY": ""}), workspace.root)
    offline = load_settings({**env, "FLEET_DAYTONA_API_URL": "http://127.0.0.1:9/api"})
    with pytest.raises(SandboxUnavailableError, match="cannot reach Daytona") as caught:
        daytona.open_daytona(offline, workspace.root)
    assert caught.value.code == "daytona_unreachable"


async def test_doctor_check(settings: Settings, fake: FakeDaytona) -> None:
    lines: list[str] = []
    assert await daytona.check_daytona(settings, lines.append)
    steps = [
        f"client for {fake.api_url}",
        "create a disposable sandbox",
        "run code",
        "write a file",
        "read it back",
        "delete the sandbox",
    ]
    assert len(lines) == len(steps)
    assert all(line.startswith(f"[ok] daytona: {want}") for line, want in zip(lines, steps, strict=True)), lines
    assert fake.sandboxes == {}


async def test_a_full_turn(env: dict[str, str], store, scripted_lm: ScriptedLM, fake: FakeDaytona) -> None:
    from fleet_kernel.engine import TurnRunner

    scripted_lm.add("*", [
        step("Read the attachment and ask the sub-model.",
             "import os\nprint(open('/workspace/files/note.txt').read())\nprint(llm_query('what is 6*7?'))\n"
             "print(sorted(os.environ))\nprint(repr(open('/proc/self/environ', 'rb').read()))"),
        step("Save the result.", "open('/workspace/artifacts/answer.md', 'w').write('# 42')\nSUBMIT(answer='42')"),
    ])  # fmt: skip
    settings = load_settings(env)
    runner = await TurnRunner(store, settings).open()
    try:
        session = await store.create_session()
        workspace = Workspace.for_session(settings.workspaces_dir, session.session_id)
        (workspace.root / "files" / "note.txt").write_text("attached note")
        handle = await runner.start(session.session_id, "What is six times seven?")
        events = [event async for event in handle.events()]
    finally:
        await runner.close()
    kinds = [e.type for e in events]
    assert events[0].data["sandbox"] == "daytona" and kinds[-1] == "turn.completed", events[-1].data
    outputs = "".join(e.data["text"] for e in events if e.type == "output")
    assert "attached note" in outputs and "sub-answer: what is 6*7?" in outputs
    assert "tool.started" in kinds and "artifact" in kinds
    assert (workspace.root / "artifacts" / "answer.md").read_text() == "# 42"
    lm_key = env["FLEET_LM_API_KEY"]
    assert lm_key not in outputs and fake.api_key not in outputs  # nothing secret inside the sandbox
    for request in fake.requests:  # and no request carries the LM key; the Daytona key only as auth
        assert lm_key.encode() not in request.body
        assert fake.api_key.encode() not in request.body
        assert all(fake.api_key not in v for k, v in request.headers.items() if k.lower() != "authorization")


@pytest.mark.live
def test_live_daytona(tmp_path: Path) -> None:
    """Opt-in: runs only with a real ``FLEET_DAYTONA_API_KEY`` (read from the environment pytest started with)."""
    key = os.environ.get("FLEET_DAYTONA_API_KEY") or _launch_env().get("FLEET_DAYTONA_API_KEY")
    if not key:
        pytest.skip("set FLEET_DAYTONA_API_KEY to run against real Daytona")
    url = os.environ.get("FLEET_DAYTONA_API_URL") or _launch_env().get("FLEET_DAYTONA_API_URL", "")
    settings = load_settings(
        {"FLEET_HOME": str(tmp_path), "FLEET_DAYTONA_API_KEY": key, **({"FLEET_DAYTONA_API_URL": url} if url else {})}
    )
    workspace = Workspace.for_session(settings.workspaces_dir, f"live-{os.getpid()}")
    factory = daytona.open_daytona(settings, workspace.root)
    try:
        interp = factory()
        interp.tools["double"] = lambda x: x * 2
        assert interp.execute("print(double(21))") == "42"
        interp.execute("open('/workspace/artifacts/live.txt', 'w').write('ok')")
    finally:
        factory.close()
        daytona.delete_session_sandboxes(settings, workspace.root.name)
    assert (workspace.root / "artifacts" / "live.txt").read_text() == "ok"


def _launch_env() -> dict[str, str]:
    """The environment this process started with (the shared conftest clears FLEET_* from ``os.environ``)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def test_cancel_stops_running_code(settings: Settings, workspace: Workspace) -> None:
    from fleet_kernel.cancel import CancelToken
    from fleet_kernel.errors import TurnCancelled

    cancel = CancelToken()
    factory = daytona.open_daytona(settings, workspace.root, cancel=cancel)
    interp = factory()
    threading.Timer(0.5, factory.interrupt).start()
    started = time.perf_counter()
    with pytest.raises(TurnCancelled):
        interp.execute("import time\nwhile True:\n    time.sleep(0.05)")
    assert time.perf_counter() - started < 30  # liveness: the loop never ends by itself
    factory.close()
    assert json.dumps({"cancelled": cancel.cancelled}) == '{"cancelled": true}'


def test_sync_reads_no_link_pipe_or_undecodable_name(settings: Settings, workspace: Workspace, tmp_path: Path) -> None:
    """What another backend's code left in the local folder (a link to a host file, a pipe, a name that is
    not UTF-8) is never read or uploaded, and a name the sandbox's code makes that is not UTF-8 stays there."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-CONTENT")
    os.symlink(secret, workspace.root / "files" / "leak.txt")
    os.mkfifo(workspace.root / "artifacts" / "pipe.txt")
    (workspace.root / "files" / os.fsdecode(b"bad-\xff.txt")).write_bytes(b"x")
    (workspace.root / "files" / "data.csv").write_text("a,b\n")
    factory = daytona.open_daytona(settings, workspace.root)
    interp = factory()
    listed = interp.execute("import os\nprint(sorted(os.listdir('/workspace/files')))")
    assert "data.csv" in listed and "leak.txt" not in listed, listed
    interp.execute(
        "open(b'/workspace/artifacts/made-\\xfe.txt', 'wb').write(b'x')\n"
        "open('/workspace/artifacts/made.txt', 'w').write('made')"
    )
    factory.close()
    assert (workspace.root / "artifacts" / "made.txt").read_text() == "made"
    factory = daytona.open_daytona(settings, workspace.root)  # the next turn syncs as before
    assert factory().execute("print(open('/workspace/artifacts/made.txt').read())") == "made"
    factory.close()
