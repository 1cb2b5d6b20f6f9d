"""``%fleet help``: every registered command, with what it does."""

from __future__ import annotations

from fleet_kernel.kernel.commands._base import Reply, command, help_lines, md
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.markdown import md_code


@command("help", "%fleet help", "this list", order=10)
async def cmd_help(ctx: KernelContext, args: list[str]) -> Reply:
    lines = help_lines()
    text = "Fleet: each cell is a turn of the session; lines starting with %fleet are commands.\n\n"
    text += "\n".join(f"    {line}" for line in lines)
    rows = []
    for line in lines:
        usage, _, what = line.partition("  ")
        rows.append(f"| {md_code(usage.strip())} | {md(what.strip())} |")
    markdown = (
        "**Fleet commands** (each cell is a turn; `%fleet` lines are commands)\n\n"
        "| command | what it does |\n|---|---|\n"
    )
    return Reply(text, markdown + "\n".join(rows))
