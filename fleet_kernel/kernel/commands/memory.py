"""``%fleet memory``: the session's memories (what ``remember()`` kept), searched or forgotten."""

from __future__ import annotations

from fleet_kernel.errors import NotFoundError
from fleet_kernel.kernel.commands._base import Reply, command, md, usage_error
from fleet_kernel.kernel.context import KernelContext


@command(
    "memory",
    "%fleet memory [search Q | forget ID]",
    "the session's memories (what remember() kept), search, forget",
    order=40,
    words=("search", "forget"),
)
async def cmd_memory(ctx: KernelContext, args: list[str]) -> Reply:
    action = args[0] if args else ""
    if action not in ("", "search", "forget") or (action == "forget" and len(args) != 2):
        raise usage_error("usage: %fleet memory | %fleet memory search <words> | %fleet memory forget <memory_id>")
    if action == "search" and len(args) < 2:
        raise usage_error("usage: %fleet memory search <words>")
    if ctx.session_id is None:
        return Reply("No session yet, so no memories: code in a turn keeps one with remember(content).")
    sessions = await ctx.sessions()
    if action == "forget":
        if not await sessions.forget_memory(ctx.session_id, args[1]):
            raise NotFoundError(f"no memory {args[1]!r} in this session (see %fleet memory)")
        return Reply(f"Forgot {args[1]}.")
    query = " ".join(args[1:])
    rows = await (await sessions.memories(ctx.session_id)).listing(query)
    if not rows:
        return Reply(
            f"No memory matches {query!r}." if query else "No memories yet: remember(content) in a turn keeps one."
        )
    lines = [f"{r.memory_id}  [{r.kind}]  {r.content}" for r in rows]
    table = "\n".join(f"| `{r.memory_id}` | {r.kind} | {md(' '.join(r.content.split()))} |" for r in rows)
    return Reply("\n".join(lines), "| memory | kind | content |\n|---|---|---|\n" + table)
