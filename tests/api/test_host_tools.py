"""Host tools of fleet.toml over the real server, sandbox and a real MCP server written with the SDK:
``[[tools]]`` functions and ``[[mcp.servers]]`` (stdio and streamable HTTP), listed by GET /api/tools and
called from sandbox code in turns, each call a tool.started/tool.finished pair."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_api import Frame, LiveServer, assert_error, events_of
from ports import free_port
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings, load_settings
from fleet_kernel.errors import ConfigError

SERVER = Path(__file__).resolve().parent.parent / "mcp_demo_server.py"


def _settings(fleet_env: dict[str, str], tmp_path: Path, toml: str) -> Settings:
    config = tmp_path / "fleet.toml"
    config.write_text(toml)
    return load_settings({**fleet_env, "FLEET_CONFIG": str(config)})


def _stdio(extra: str = "") -> str:
    return f"""
[[mcp.servers]]
name = "demo"
command = {str(sys.executable)!r}
args = [{str(SERVER)!r}]
env = {{ DEMO_GREETER = "${{DEMO_SECRET}}" }}
tools = ["add", "greet", "die", "nap", "pid"]
timeout_s = 3
{extra}
"""


def _turn(client: httpx.Client, sid: str, task: str, **body: Any) -> list[Frame]:
    with client.stream("POST", f"/api/sessions/{sid}/turns", json={"task": task, **body}) as r:
        assert r.status_code == 200, r.read()
        return events_of(r)


def _tool_calls(frames: list[Frame]) -> list[tuple[str, bool]]:
    names = {f.envelope["data"]["call_id"]: f.envelope["data"]["name"] for f in frames if f.event == "tool.started"}
    return [
        (names[f.envelope["data"]["call_id"]], f.envelope["data"]["ok"]) for f in frames if f.event == "tool.finished"
    ]


def _outputs(frames: list[Frame]) -> str:
    return "".join(str(f.envelope["data"]["text"]) for f in frames if f.event == "output")


@pytest.fixture
def stdio_settings(fleet_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEMO_SECRET", "greeter-from-env")  # the server's env names it: ${DEMO_SECRET}
    toml = _stdio() + '\n[[tools]]\npath = "host_tools_example:search"\ntimeout_s = 5\n'
    return _settings(fleet_env, tmp_path, toml)


@pytest.mark.slow
def test_tools_are_listed_and_called_from_a_turn(stdio_settings: Settings, scripted_lm: ScriptedLM) -> None:
    scripted_lm.add("use the tools", [
        step("Call them.", "print('sum', demo__add(2, 40))\nprint(demo__greet(name='Ada'))\nprint(search('q3'))"),
        step("Whose?", "print('server pid', demo__pid())"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    with LiveServer(stdio_settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        listed = client.get("/api/tools").json()
        by_name = {t["name"]: t for t in listed["tools"]}
        assert set(by_name) == {"search", "demo__add", "demo__greet", "demo__die", "demo__nap", "demo__pid"}
        assert by_name["search"]["source"] == "fleet.toml"
        assert by_name["search"]["signature"].startswith("search(query: str, limit: int = 2)")
        assert by_name["demo__add"] == {
            "name": "demo__add",
            "signature": "demo__add(a: int, b: int)",
            "docstring": "Add two whole numbers.",
            "source": "mcp:demo",
        }
        assert listed["warnings"] == []

        sid = client.post("/api/sessions", json={"title": "tools"}).json()["session_id"]
        frames = _turn(client, sid, "use the tools")
        assert frames[-1].event == "turn.completed", frames[-1].envelope["data"]
        assert _tool_calls(frames) == [
            ("demo__add", True),
            ("demo__greet", True),
            ("search", True),
            ("demo__pid", True),
        ]
        out = _outputs(frames)
        assert "sum 42" in out
        assert "Hello, Ada! (from ***)" in out  # env resolved from ${DEMO_SECRET}, scrubbed from events
        assert "greeter-from-env" not in str([f.envelope for f in frames])
        assert "['q3 report 1', 'q3 report 2']" in out
        prompt = str(scripted_lm.root_requests()[0]["messages"])
        assert "demo__add" in prompt and "Add two whole numbers." in prompt
        assert "demo__hidden" not in prompt
    server_pid = int(re.search(r"server pid (\d+)", out).group(1))  # type: ignore[union-attr]
    assert _gone(server_pid), "the MCP server outlived the Fleet server"


def _gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_turn_names_its_tools_and_an_unknown_one_is_refused(
    stdio_settings: Settings, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("only search", [
        step("Try.", "print(search('x', limit=1))\ntry:\n    demo__add(1, 2)\nexcept NameError as e:\n    print('no add')"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    with LiveServer(stdio_settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        sid = client.post("/api/sessions", json={"title": "tools"}).json()["session_id"]
        refused = client.post(f"/api/sessions/{sid}/turns", json={"task": "x", "tools": ["demo__hidden"]})
        body = assert_error(refused, 422)
        assert "'demo__hidden' is not a host tool" in body["message"]
        frames = _turn(client, sid, "only search", tools=["search"])
        assert frames[-1].event == "turn.completed", frames[-1].envelope["data"]
        assert "no add" in _outputs(frames)
        assert _tool_calls(frames) == [("search", True)]


@pytest.mark.slow
def test_a_server_that_dies_or_hangs_fails_that_call_not_the_turn(
    stdio_settings: Settings, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add("break it", [
        step("Kill it.", "try:\n    demo__die()\nexcept Exception as e:\n    print('died:', e)"),
        step("Hang it.", "try:\n    demo__nap(seconds=4)\nexcept Exception as e:\n    print('hung:', e)"),
        step("Again.", "print('again', demo__add(a=1, b=1))"),
        step("Done.", "SUBMIT(answer='survived')"),
    ])  # fmt: skip
    with LiveServer(stdio_settings) as live, httpx.Client(base_url=live.url, timeout=90) as client:
        sid = client.post("/api/sessions", json={"title": "tools"}).json()["session_id"]
        started = time.monotonic()
        frames = _turn(client, sid, "break it")
        assert frames[-1].event == "turn.completed", frames[-1].envelope["data"]
        assert frames[-1].envelope["data"]["answer"] == "survived"
        assert _tool_calls(frames) == [("demo__die", False), ("demo__nap", False), ("demo__add", True)]
        out = _outputs(frames)
        assert "died: MCPCallError: MCP server 'demo' stopped during the call to 'die'" in out
        assert "hung: MCPCallError: MCP tool demo__nap did not answer within 3 s (timeout_s)" in out
        assert "again 2" in out
        assert time.monotonic() - started < 60


def test_a_bad_tool_path_is_a_config_error(fleet_env: dict[str, str], tmp_path: Path) -> None:
    from fleet_kernel.engine.host_tools import HostTools

    for path, why in [
        ("no_such_module_here:search", "ModuleNotFoundError"),
        ("host_tools_example:missing", "AttributeError"),
        ("host_tools_example:NOT_A_FUNCTION", "is a int, not a function"),
    ]:
        settings = _settings(fleet_env, tmp_path, f'[[tools]]\npath = "{path}"\n')
        with pytest.raises(ConfigError) as caught:
            HostTools(settings).functions()
        assert caught.value.message.startswith("tools[0].path: ")
        assert why in caught.value.message
    with pytest.raises(ConfigError, match="module:function"):
        _settings(fleet_env, tmp_path, '[[tools]]\npath = "nocolon"\n')
    with pytest.raises(ConfigError, match="either command"):
        _settings(fleet_env, tmp_path, '[[mcp.servers]]\nname = "x"\n')


# ---------------------------------------------------------------------- streamable HTTP


@pytest.fixture
def http_mcp() -> Iterator[str]:
    """The demo server's streamable-HTTP app under uvicorn on 127.0.0.1, checking a bearer header."""
    import uvicorn
    from mcp_demo_server import http_app

    inner = http_app()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and headers.get(b"authorization") != b"Bearer tok-123":
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no"})
            return
        await inner(scope, receive, send)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(10)


def test_a_streamable_http_server_with_headers_from_the_environment(
    fleet_env: dict[str, str], tmp_path: Path, http_mcp: str, scripted_lm: ScriptedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEMO_MCP_TOKEN", "tok-123")
    toml = f"""
[[mcp.servers]]
name = "remote"
url = "{http_mcp}"
headers = {{ Authorization = "Bearer ${{DEMO_MCP_TOKEN}}" }}
tools = ["add"]
"""
    settings = _settings(fleet_env, tmp_path, toml)
    scripted_lm.add("add remotely", [
        step("Add.", "print('remote sum', remote__add(a=20, b=22))"),
        step("Done.", "SUBMIT(answer='ok')"),
    ])  # fmt: skip
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        listed = client.get("/api/tools").json()
        assert [t["name"] for t in listed["tools"]] == ["remote__add"]
        sid = client.post("/api/sessions", json={"title": "remote"}).json()["session_id"]
        frames = _turn(client, sid, "add remotely")
        assert frames[-1].event == "turn.completed", frames[-1].envelope["data"]
        assert "remote sum 42" in _outputs(frames)
        started = [f.envelope for f in frames if f.event == "tool.started"]
        assert "tok-123" not in str([f.envelope for f in frames])
        assert started and started[0]["data"]["name"] == "remote__add"


def test_the_api_refuses_to_start_with_a_bad_tool_path(fleet_env: dict[str, str], tmp_path: Path) -> None:
    import asyncio

    from fleet_api import create_app

    app = create_app(_settings(fleet_env, tmp_path, '[[tools]]\npath = "no_such_module_here:search"\n'))

    async def start_up() -> None:
        async with app.router.lifespan_context(app):
            pytest.fail("the app started")

    with pytest.raises(ConfigError, match=r"tools\[0\]\.path: cannot import 'no_such_module_here:search'"):
        asyncio.run(start_up())
