"""The ``fleet`` kernel's turns call the host tools of its fleet.toml: a ``[[tools]]`` function and the tools
of a stdio MCP server written with the SDK; the server stops when the kernel shuts down."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, step

TESTS = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_kernel_turns_call_fleet_toml_and_mcp_tools(start_kernel: Any, scripted_lm: ScriptedLM, tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[[tools]]\npath = "host_tools_example:search"\n\n'
        f'[[mcp.servers]]\nname = "demo"\ncommand = {sys.executable!r}\nargs = [{str(TESTS / "mcp_demo_server.py")!r}]\n'
        'tools = ["add", "pid"]\n'
    )
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    kernel = start_kernel(FLEET_CONFIG=str(config), PYTHONPATH=path)
    listed = kernel.run("%fleet tools", timeout=60).text()  # as GET /api/tools lists them
    assert (
        "search(query: str, limit: int = 2) -> list[str]  [fleet.toml]  The titles of documents matching" in listed
    ), listed
    assert "demo__add(a: int, b: int)  [mcp:demo]  Add two whole numbers." in listed, listed
    assert "demo__greet" not in listed  # left out by the allow-list
    scripted_lm.add("use my tools", [
        step("Call.", "found = search('tides', limit=1)\nsum_ = demo__add(a=1, b=2)\npid = demo__pid()"),
        step("Done.", "SUBMIT(answer=f'{found[0]} / {sum_} / pid {pid}')"),
    ])  # fmt: skip
    text = kernel.run("use my tools", timeout=120).text()
    assert "tides report 1 / 3 / pid" in text, text
    server_pid = int(re.search(r"pid (\d+)", text).group(1))  # type: ignore[union-attr]
    os.kill(server_pid, 0)  # running while the kernel runs
    kernel.graceful = True
    kernel.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("the MCP server outlived the kernel")


@pytest.mark.slow
def test_the_python3_magic_lists_notebook_functions_then_host_tools(fleet_env: dict[str, str], tmp_path: Path) -> None:
    from kernel_harness import PythonKernel

    config = tmp_path / "fleet.toml"
    config.write_text('[[tools]]\npath = "host_tools_example:search"\n')
    path = os.pathsep.join(filter(None, [str(TESTS), fleet_env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))
    py = PythonKernel({**fleet_env, "FLEET_CONFIG": str(config), "PYTHONPATH": path})  # and %load_ext fleet_kernel
    try:
        py.ok("def area(w, h):\n    return w * h")
        listed = py.ok("%fleet tools add area").text()
        assert "area" in listed and "Host tools" not in listed  # adding shows what was added
        listed = py.ok("%fleet tools").text()
        assert listed.index("Notebook functions turns may call: area") < listed.index("Host tools (fleet.toml):")
        assert "search(query: str, limit: int = 2) -> list[str]  [fleet.toml]" in listed, listed
    finally:
        py.close()
