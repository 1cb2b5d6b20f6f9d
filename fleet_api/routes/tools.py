"""``GET /api/tools``: the host tools of ``fleet.toml`` a turn of this server may call.

Listing them starts the MCP servers that do not run yet (their tools are whatever the server says).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from fleet_api.deps import State
from fleet_api.routes._docs import errors
from fleet_api.schemas import HostToolInfo, ToolList

router = APIRouter(tags=["tools"])


@router.get("/tools", response_model=ToolList, responses=errors())
async def list_tools(state: State) -> ToolList:
    tools, failed = await asyncio.to_thread(state.runner.host_tools.listing)
    return ToolList(
        tools=[HostToolInfo.model_validate(tool.listing()) for tool in tools],
        warnings=[f"MCP server {name!r} left out: {why}" for name, why in failed.items()],
    )
