"""The operator's host tools: functions named in ``[[tools]]`` and the tools of ``[[mcp.servers]]``.

Both run on the host (they are the operator's code, or servers the operator chose), called from sandbox
code through the turn's tool threads like ``remember`` or ``load_skill``, so each call is a
``tool.started``/``tool.finished`` pair. ``GET /api/tools`` lists them; a turn uses all of them unless it
names the ones it wants (``tools``). An MCP tool is called ``<server>__<tool>``: stable however many
servers there are, and never taken for a tool of another server.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.engine.mcp_servers import MCPCallError, MCPServers, MCPTool
from fleet_kernel.errors import ConfigError, ValidationError
from fleet_kernel.tool_config import ToolSource

log = logging.getLogger(__name__)
SEPARATOR = "__"
MAX_DESCRIPTION_CHARS = 2_000  # of one tool in the prompt: a server's descriptions are not the operator's to trim
JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}


class ToolTimeout(RuntimeError):
    """A ``[[tools]]`` function ran past its ``timeout_s`` (it goes on in its thread; its result is dropped)."""


@dataclass
class HostTool:
    """One host tool as listed and as called: ``call`` takes keyword arguments."""

    name: str
    signature: str
    docstring: str
    source: str  # "fleet.toml" or "mcp:<server>"
    args: dict[str, Any]  # JSON schema of each argument, for the prompt and for dspy.Tool
    call: Callable[..., Any]
    parameters: inspect.Signature
    target: Callable[..., Any] | None = None  # a [[tools]] function: dspy reads its argument types from it

    def listing(self) -> dict[str, str]:
        return {"name": self.name, "signature": self.signature, "docstring": self.docstring, "source": self.source}

    def function(self) -> Callable[..., Any]:
        """A function with this tool's name and signature, for the sandbox's tool table."""

        def tool(*args: Any, **kwargs: Any) -> Any:
            bound = self.parameters.bind(*args, **kwargs)
            return self.call(**bound.arguments)

        tool.__name__ = tool.__qualname__ = self.name
        tool.__doc__ = self.docstring
        tool.__signature__ = self.parameters  # type: ignore[attr-defined]
        return tool

    def as_dspy(self) -> Any:
        """A ``dspy.Tool`` for the turn's RLM (called on the turn's side, where dspy is loaded)."""
        import dspy  # noqa: PLC0415 - dspy only on the turn's side

        if self.target is not None:
            spec = dspy.Tool(self.target, name=self.name)
            return spec.model_copy(update={"func": self.function()})
        return dspy.Tool(self.function(), name=self.name, desc=self.docstring or None, args=self.args)


def import_tool(index: int, source: ToolSource) -> HostTool:
    """The function at ``source.path``, imported now.

    Raises:
        ConfigError: it cannot be imported, or is not a function; the message names the key.
    """
    key = f"tools[{index}].path"
    module_name, _, attr = source.path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # noqa: BLE001 - any failure of the operator's module is a config error
        raise ConfigError(f"{key}: cannot import {source.path!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"{key}: {source.path!r} is a {type(target).__name__}, not a function")
    name = str(source.name or getattr(target, "__name__", ""))
    if not name.isidentifier():
        raise ConfigError(f"{key}: {source.path!r} has no usable name; give one with name = '...'")
    try:
        signature = inspect.signature(target, eval_str=True)  # the module's own `from __future__ import annotations`
    except Exception:  # noqa: BLE001 - a name only the type checker sees: shown as written
        signature = inspect.signature(target)
    args = _schema_of(signature)
    timeout = source.timeout_s

    def call(**kwargs: Any) -> Any:
        return _with_timeout(name, timeout, target, kwargs)

    doc = inspect.getdoc(target) or ""
    return HostTool(name, f"{name}{signature}", doc, "fleet.toml", args, call, signature, target)


def _with_timeout(name: str, timeout: float, func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``func(**kwargs)`` on its own thread, waited for at most ``timeout`` seconds."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(func(**kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    threading.Thread(target=run, name=f"fleet-tool-{name}", daemon=True).start()
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise ToolTimeout(f"the tool {name} did not return within {timeout:g} s (timeout_s in fleet.toml)") from None


def _schema_of(signature: inspect.Signature) -> dict[str, Any]:
    reverse = {v: k for k, v in JSON_TYPES.items()}
    args = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation
        type_name = getattr(annotation, "__name__", annotation if isinstance(annotation, str) else "")
        args[param.name] = {"type": reverse[type_name]} if type_name in reverse else {}
    return args


def mcp_tool(servers: MCPServers, tool: MCPTool) -> HostTool:
    """``tool`` of an MCP server as a host tool named ``<server>__<tool>``."""
    name = f"{tool.server}{SEPARATOR}{_identifier(tool.name)}"
    properties: dict[str, Any] = dict(tool.input_schema.get("properties") or {})
    required = set(tool.input_schema.get("required") or ())
    params = []
    for arg, schema in properties.items():
        if not arg.isidentifier():
            continue
        annotation = JSON_TYPES.get(str(schema.get("type")), "Any") if isinstance(schema, dict) else "Any"
        default = inspect.Parameter.empty if arg in required else schema.get("default", None)
        params.append(inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation))
        if default is not inspect.Parameter.empty:
            params[-1] = params[-1].replace(default=default)
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first
    signature = inspect.Signature(params)
    shown = ", ".join(
        f"{p.name}: {p.annotation}" + ("" if p.default is inspect.Parameter.empty else f" = {p.default!r}")
        for p in params
    )

    def call(**kwargs: Any) -> Any:
        return servers.call(tool.server, tool.name, kwargs)

    args = {arg: schema for arg, schema in properties.items() if arg.isidentifier()}
    description = tool.description.strip()
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS] + " ..."
    return HostTool(name, f"{name}({shown})", description, f"mcp:{tool.server}", args, call, signature)


def _identifier(name: str) -> str:
    text = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return text if text.isidentifier() else f"t_{text}"


class HostTools:
    """This process's host tools from ``fleet.toml``: the functions imported once, the MCP servers
    started when first needed and stopped by ``close``."""

    def __init__(self, settings: Settings) -> None:
        self.sources = settings.policy.tools
        self.mcp = MCPServers(settings.policy.mcp.servers)
        self._functions: list[HostTool] | None = None

    @property
    def configured(self) -> bool:
        return bool(self.sources or self.mcp.specs)

    def functions(self) -> list[HostTool]:
        """The ``[[tools]]`` functions, imported on first use.

        Raises:
            ConfigError: a path cannot be imported, or two tools share a name.
        """
        if self._functions is None:
            tools = [import_tool(i, source) for i, source in enumerate(self.sources)]
            names = [t.name for t in tools]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ConfigError(f"tools: more than one [[tools]] entry is named {twice}; give each a name")
            self._functions = tools
        return self._functions

    def server_tools(self, server: str) -> list[HostTool]:
        """The tools of one MCP server (starting it). Raises ``MCPCallError`` if it cannot start."""
        return [mcp_tool(self.mcp, tool) for tool in self.mcp.tools(server)]

    def listing(self) -> tuple[list[HostTool], dict[str, str]]:
        """Every host tool, and the servers that could not start with why (they are left out)."""
        tools = list(self.functions())
        failed = {}
        for server in self.mcp.specs:
            try:
                tools.extend(self.server_tools(server))
            except MCPCallError as exc:
                failed[server] = str(exc)
        return tools, failed

    def describe(self) -> list[str]:
        """``listing`` as lines for a person (``%fleet tools``): signature, source, the docstring's first
        line; then a line for each MCP server left out. Empty when nothing is configured."""
        tools, failed = self.listing()
        lines = []
        for tool in tools:
            doc = tool.docstring.strip().splitlines()[0] if tool.docstring.strip() else ""
            lines.append(f"{tool.signature}  [{tool.source}]" + (f"  {doc}" if doc else ""))
        lines.extend(f"MCP server {name!r} left out: {why}" for name, why in failed.items())
        return lines

    def select(self, names: list[str] | tuple[str, ...] | None) -> list[HostTool]:
        """The tools a turn uses: all (``names`` None), else those named, in order.

        Raises:
            ValidationError: a name that is no host tool (or whose MCP server cannot start).
        """
        if names is None:
            tools, failed = self.listing()
            for server, why in failed.items():
                log.warning("MCP server %r left out of the turn: %s", server, why)
            return tools
        by_name = {t.name: t for t in self.functions()}
        chosen = []
        for name in dict.fromkeys(names):
            server, sep, _ = name.partition(SEPARATOR)
            if name not in by_name and sep and server in self.mcp.specs:
                try:
                    by_name.update({t.name: t for t in self.server_tools(server)})
                except MCPCallError as exc:
                    raise ValidationError(f"the tool {name!r} is not available: {exc}") from exc
            if name not in by_name:
                known = ", ".join(sorted(by_name)) or "none configured"
                raise ValidationError(
                    f"{name[:80]!r} is not a host tool: GET /api/tools lists them (fleet.toml [[tools]], MCP "
                    f"tools as <server>__<tool>); known here: {known}"
                )
            chosen.append(by_name[name])
        return chosen

    def close(self) -> None:
        self.mcp.close()
