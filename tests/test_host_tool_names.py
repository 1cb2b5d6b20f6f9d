"""How host tools are named and described (engine.host_tools), without starting a server."""

from __future__ import annotations

import pytest

from fleet_kernel.config import Settings
from fleet_kernel.engine.host_tools import MAX_DESCRIPTION_CHARS, HostTools, mcp_tool
from fleet_kernel.engine.mcp_servers import MCPServers, MCPTool
from fleet_kernel.errors import ValidationError


def test_an_mcp_tool_is_named_for_its_server_and_shows_its_arguments() -> None:
    schema = {
        "type": "object",
        "properties": {"limit": {"type": "integer", "default": 5}, "query": {"type": "string"}},
        "required": ["query"],
    }
    tool = mcp_tool(MCPServers(()), MCPTool("gh", "search-issues", "Find issues. " * 400, schema))
    assert tool.name == "gh__search_issues"
    assert tool.signature == "gh__search_issues(query: str, limit: int = 5)"  # required arguments first
    assert tool.source == "mcp:gh"
    assert len(tool.docstring) <= MAX_DESCRIPTION_CHARS + 4
    assert str(tool.parameters) == "(query: 'str', limit: 'int' = 5)"


def test_a_turn_naming_an_unknown_tool_is_refused(settings: Settings) -> None:
    with pytest.raises(ValidationError, match="'nope' is not a host tool.*none configured"):
        HostTools(settings).select(["nope"])
    assert HostTools(settings).select([]) == []
    assert HostTools(settings).select(None) == []
