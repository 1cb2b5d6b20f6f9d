"""MCP servers of ``fleet.toml`` as tool sources, through the official MCP Python SDK (package ``mcp``).

Sandbox code calls tools from tool threads, synchronously; the SDK's client is async and its transports
must be opened and closed in one task. So this process has one event loop thread for MCP: each server is
a task there that opens the transport (a stdio subprocess, or streamable HTTP), keeps the session open and
closes it when told, and a call from a tool thread is a coroutine sent to that loop and waited for, at most
the server's ``timeout_s``. A server starts with the first call that needs it (a turn's tools, or the
tools listing) and stops when Fleet closes it (``close``, also run at process exit). A server that died
fails the call that finds it dead, with an error saying so; the next call starts it again.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleet_kernel.errors import ConfigError
from fleet_kernel.tool_config import MCPServer

log = logging.getLogger(__name__)
T = TypeVar("T")
CLOSE_WAIT_S = 5.0
CONNECTION_CLOSED = -32000  # the JSON-RPC code the SDK gives a request whose connection closed


class MCPCallError(RuntimeError):
    """A call to an MCP server failed: the server is gone, hung, or the tool reported an error.

    Raised on the tool thread, it reaches sandbox code as an ordinary exception the model can read.
    """


@dataclass
class MCPTool:
    """A tool a server offers, as listed by it."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass
class _Connection:
    """One server's session, owned by its task on the MCP loop."""

    spec: MCPServer
    session: Any = None
    tools: list[MCPTool] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] = field(init=False)  # started by ``_connected`` as soon as the connection is made
    error: BaseException | None = None  # why it could not start, or why it ended

    @property
    def dead(self) -> bool:
        """Ended, or found closed by a call: the next call starts the server again."""
        return self.task.done() or self.stop.is_set()


class MCPServers:
    """The configured MCP servers of this process, started on first use, on one event loop thread."""

    def __init__(self, specs: tuple[MCPServer, ...]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[str, _Connection] = {}
        self._lock = threading.Lock()  # guards starting the loop thread

    # ------------------------------------------------------------------ the loop thread

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the MCP loop and wait for it, at most ``timeout`` seconds."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-mcp", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    # ------------------------------------------------------------------ connections (on the loop)

    async def _connected(self, name: str) -> _Connection:
        conn = self._connections.get(name)
        if conn is None or conn.dead:
            conn = _Connection(self.specs[name])
            self._connections[name] = conn
            conn.task = asyncio.get_running_loop().create_task(self._serve(conn), name=f"fleet-mcp-{name}")
        try:
            await asyncio.wait_for(conn.ready.wait(), conn.spec.startup_timeout_s)
        except TimeoutError:
            conn.stop.set()
            raise MCPCallError(
                f"MCP server {name!r} did not start within {conn.spec.startup_timeout_s:g} s (startup_timeout_s)"
            ) from None
        if conn.session is None:
            raise MCPCallError(f"MCP server {name!r} could not start: {_describe(conn.error)}")
        return conn

    async def _serve(self, conn: _Connection) -> None:
        """Open the server's transport and session, list its tools, hold them open until told to stop."""
        spec = conn.spec
        try:
            from mcp import ClientSession  # noqa: PLC0415 - the optional mcp extra
        except ImportError:
            conn.error = ConfigError("the MCP SDK is not installed: pip install 'fleet-kernel[mcp]'")
            conn.ready.set()
            return
        try:
            async with _transport(spec) as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                listed = await session.list_tools()
                allowed = set(spec.tools) if spec.tools is not None else None
                conn.tools = [
                    MCPTool(
                        spec.name,
                        tool.name,
                        tool.description or "",
                        dict(getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}),
                    )
                    for tool in listed.tools
                    if allowed is None or tool.name in allowed
                ]
                conn.session = session
                conn.ready.set()
                await conn.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - the server ended; its calls say why
            conn.error = exc
            if not isinstance(exc, asyncio.CancelledError | GeneratorExit):
                log.warning("MCP server %r ended: %s", spec.name, _describe(exc))
        finally:
            conn.session = None
            conn.ready.set()

    async def _call(self, server: str, tool: str, arguments: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109 - bounds a wait on two tasks (the call, its server)
        conn = await self._connected(server)
        task = asyncio.ensure_future(conn.session.call_tool(tool, arguments))
        done, _ = await asyncio.wait({task, conn.task}, timeout=timeout, return_when="FIRST_COMPLETED")
        if task not in done:
            task.cancel()
            if conn.task in done:  # the server ended during the call
                raise MCPCallError(
                    f"MCP server {server!r} stopped during the call to {tool!r}: {_describe(conn.error)}; "
                    "it is started again on the next call"
                )
            raise MCPCallError(f"MCP tool {server}__{tool} did not answer within {timeout:g} s (timeout_s)")
        try:
            result = task.result()
        except Exception as exc:
            if getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED:
                conn.stop.set()  # the session is gone: close what is left of it, start afresh next time
                raise MCPCallError(
                    f"MCP server {server!r} stopped during the call to {tool!r} (its connection closed); "
                    "it is started again on the next call"
                ) from None
            raise MCPCallError(f"MCP tool {server}__{tool} failed: {_describe(exc)}") from None
        return _result(server, tool, result)

    async def _close(self) -> None:
        conns = list(self._connections.values())
        for conn in conns:
            conn.stop.set()
        tasks = [c.task for c in conns]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)

    # ------------------------------------------------------------------ public interface

    def tools(self, server: str) -> list[MCPTool]:
        """The tools ``server`` offers (its allow-list applied), starting it if it does not run.

        Raises:
            MCPCallError: the server could not start.
        """
        spec = self.specs[server]

        async def listed() -> list[MCPTool]:
            return (await self._connected(server)).tools

        try:
            return self._run(listed(), spec.startup_timeout_s + 1)
        except concurrent.futures.TimeoutError:
            raise MCPCallError(f"MCP server {server!r} did not start within {spec.startup_timeout_s:g} s") from None

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        """Call ``tool`` of ``server`` and wait for its result (structured when the tool gives one, else text).

        Raises:
            MCPCallError: the server is gone, did not answer within ``timeout_s``, or the tool failed.
        """
        spec = self.specs[server]
        try:
            return self._run(
                self._call(server, tool, arguments, spec.timeout_s), spec.startup_timeout_s + spec.timeout_s
            )
        except concurrent.futures.TimeoutError:
            raise MCPCallError(f"MCP tool {server}__{tool} did not answer within {spec.timeout_s:g} s") from None

    def close(self) -> None:
        """Stop every server this process started (their subprocesses end with their sessions)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with _suppress():
            self._run(self._close(), CLOSE_WAIT_S + 1)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
        self._connections.clear()
        self._loop = None


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        if exc[1] is not None:
            log.warning("stopping MCP servers: %s", _describe(exc[1]))  # type: ignore[arg-type]
        return True


def _transport(spec: MCPServer) -> Any:
    """The SDK's client transport for ``spec``: a subprocess over stdio, or streamable HTTP."""
    if spec.command is not None:
        from mcp import StdioServerParameters, stdio_client  # noqa: PLC0415 - the optional mcp extra

        env = spec.resolved(spec.env, "env") or None
        return stdio_client(StdioServerParameters(command=spec.command, args=list(spec.args), env=env))
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415 - the optional mcp extra
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415 - the optional mcp extra

    if spec.url is None:
        raise ConfigError(f"[[mcp.servers]] {spec.name!r}: give either command (stdio) or url (streamable HTTP)")
    headers = spec.resolved(spec.headers, "headers")
    return streamable_http_client(spec.url, http_client=create_mcp_http_client(headers=headers))


def _result(server: str, tool: str, result: Any) -> Any:
    """A ``CallToolResult`` as a plain value: its structured content (unwrapped from ``{"result": v}``, as
    servers wrap a plain return value), else its text; a result marked as an error raises."""
    texts = [str(getattr(part, "text", "")) for part in result.content if getattr(part, "type", "") == "text"]
    text = "\n".join(texts)
    is_error = getattr(result, "is_error", None) or getattr(result, "isError", False)
    if is_error:
        raise MCPCallError(f"MCP tool {server}__{tool} reported an error: {text or '(no message)'}")
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if isinstance(structured, dict):
        return structured["result"] if list(structured) == ["result"] else structured
    if texts:
        return text
    return [part.model_dump(mode="json") for part in result.content]


def _describe(exc: BaseException | None) -> str:
    """A readable reason, looking inside the exception groups anyio's task groups raise."""
    if exc is None:
        return "it ended"
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, ConfigError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
