"""The ``[[tools]]`` and ``[[mcp.servers]]`` sections of ``fleet.toml``: host tools the operator adds.

Declared here and checked when the file is read (a bad entry is a ``ConfigError`` naming its key); the
functions are imported and the servers started later, by ``engine.host_tools``. Values of an MCP server's
``env`` and ``headers`` may name environment variables as ``${NAME}``: the secret stays in the environment,
never in ``fleet.toml``, events or logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleet_kernel.errors import ConfigError

_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolSource(_Entry):
    """One ``[[tools]]`` entry: a function of the operator's, run on the host when sandbox code calls it."""

    path: str = Field(..., description="module:function, importable by Fleet's Python (mypkg.tools:search)")
    name: str | None = Field(None, description="the name sandbox code calls it by; default: the function's")
    timeout_s: float = Field(60, gt=0, le=3_600, description="how long one call may take")

    @field_validator("path")
    @classmethod
    def _module_and_name(cls, value: str) -> str:
        if not _PATH.fullmatch(value):
            raise ValueError("a tool path is module:function, such as 'mypkg.tools:search'")
        return value

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not value.isidentifier():
            raise ValueError("a tool name is a Python identifier")
        return value


class MCPServer(_Entry):
    """One ``[[mcp.servers]]`` entry: a stdio ``command`` or a streamable-HTTP ``url``."""

    name: str = Field(..., description="names the server; its tools are called <name>__<tool>")
    command: str | None = Field(None, description="stdio: the program that runs the server")
    args: tuple[str, ...] = Field((), description="stdio: the program's arguments")
    env: dict[str, str] = Field({}, description="stdio: more environment variables; values may use ${VAR}")
    url: str | None = Field(None, description="streamable HTTP: the server's endpoint")
    headers: dict[str, str] = Field({}, description="HTTP headers; values name environment variables as ${VAR}")
    tools: tuple[str, ...] | None = Field(None, description="the only tools of the server offered; default all")
    timeout_s: float = Field(60, gt=0, le=3_600, description="how long one tool call may take")
    startup_timeout_s: float = Field(30, gt=0, le=600, description="how long the server may take to start")

    @field_validator("name")
    @classmethod
    def _server_name(cls, value: str) -> str:
        if not value.isidentifier() or "__" in value:
            raise ValueError("a server name is an identifier without '__' (it prefixes its tools' names)")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url is not None and (self.args or self.env):
            raise ValueError("args and env are for a stdio server (command)")
        if self.command is not None and self.headers:
            raise ValueError("headers are for an HTTP server (url)")
        return self

    def resolved(self, values: Mapping[str, str], key: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """``values`` (this server's ``env`` or ``headers``) with each ``${VAR}`` replaced from the environment.

        Raises:
            ConfigError: a variable named is not set.
        """
        environ = os.environ if environ is None else environ
        resolved = {}
        for field, text in values.items():
            for var in _REFERENCE.findall(text):
                if var not in environ:
                    raise ConfigError(
                        f"mcp.servers {self.name!r}: {key}.{field} names ${{{var}}}, which is not set in the "
                        "environment"
                    )
            resolved[field] = _REFERENCE.sub(lambda m: environ[m.group(1)], text)
        return resolved


class MCP(_Entry):
    """The ``[mcp]`` section: its ``servers``."""

    servers: tuple[MCPServer, ...] = ()

    @field_validator("servers")
    @classmethod
    def _unique(cls, servers: tuple[MCPServer, ...]) -> tuple[MCPServer, ...]:
        names = [s.name for s in servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"server names must be unique; {twice} appear more than once")
        return servers


def referenced_secrets(mcp: MCP, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment variables the servers' ``env`` and ``headers`` name (tokens, most
    likely): Fleet scrubs them from events, logs and errors like its own keys."""
    environ = os.environ if environ is None else environ
    names = {
        var
        for server in mcp.servers
        for text in (*server.env.values(), *server.headers.values())
        for var in _REFERENCE.findall(text)
    }
    return [environ[name] for name in sorted(names) if environ.get(name)]
