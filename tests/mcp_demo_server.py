"""A small MCP server written with the SDK (``MCPServer``, FastMCP before mcp 2), for the MCP tests.

``python tests/mcp_demo_server.py`` serves it over stdio; ``http_app()`` is its streamable-HTTP app.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("demo")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def greet(name: str, punctuation: str = "!") -> str:
    """A greeting for `name`."""
    return f"Hello, {name}{punctuation} (from {os.environ.get('DEMO_GREETER', 'nobody')})"


@server.tool()
def hidden() -> str:
    """A tool the allow-list of the tests leaves out."""
    return "you should not see this"


@server.tool()
def die() -> str:
    """Kill this server's own process, as a crash would."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer: a server that hangs."""
    time.sleep(seconds)
    return "awake"


def http_app() -> Any:
    return server.streamable_http_app()


if __name__ == "__main__":
    server.run()
