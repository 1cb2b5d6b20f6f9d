"""``%fleet tools``: the host tools of ``fleet.toml`` turns may call."""

from __future__ import annotations

import asyncio

from fleet_kernel.kernel.commands._base import Reply, command, usage_error
from fleet_kernel.kernel.context import KernelContext


@command("tools", "%fleet tools", "the host tools of fleet.toml ([[tools]], MCP) turns may call", order=130)
async def cmd_tools(ctx: KernelContext, args: list[str]) -> Reply:
    """The host tools turns may call, as ``GET /api/tools`` lists them (listing starts the MCP servers)."""
    if args:
        raise usage_error("usage: %fleet tools")
    runner = await ctx.open()
    lines = await asyncio.to_thread(runner.host_tools.describe)
    if not lines:
        return Reply("No host tools: add [[tools]] or [[mcp.servers]] to fleet.toml (docs/configuration.md).")
    return Reply("Host tools (fleet.toml):\n" + "\n".join(f"  {line}" for line in lines))
