"""``%fleet history``: what the next turn sees of earlier turns; forget or restore one."""

from __future__ import annotations

from fleet_kernel.kernel.commands._base import Reply, command, md, usage_error
from fleet_kernel.kernel.context import KernelContext

HISTORY_ACTIONS = ("forget", "restore")


@command(
    "history",
    "%fleet history [forget|restore <turn_id>]",
    "what the next turn sees of earlier turns; take one out or back",
    order=140,
    words=HISTORY_ACTIONS,
)
async def cmd_history(ctx: KernelContext, args: list[str]) -> Reply:
    """What the next turn sees of earlier turns (``compaction.plan_history``, as the runner plans it): the
    session's summary of the older ones and the latest whole; or forget/restore one turn."""
    # the engine (store, SQLAlchemy) loads after the kernel starts
    from fleet_kernel.engine.compaction import span

    if args and (args[0] not in HISTORY_ACTIONS or len(args) != 2):
        raise usage_error("usage: %fleet history [forget|restore <turn_id>] (turn ids are listed by %fleet history)")
    if ctx.session_id is None:
        return Reply("No session yet: the first turn sees no history.")
    sessions = await ctx.sessions()
    if args:
        keep = args[0] == "restore"
        await sessions.keep_in_history(ctx.session_id, args[1], keep)
        if keep:
            return Reply(f"Turn {args[1]} is back in the history the next turns see.")
        return Reply(
            f"Turn {args[1]} is out of the history the next turns see (undo: %fleet history restore {args[1]})."
        )
    plan = await sessions.history(ctx.session_id)
    turns, older = plan.recent, plan.older
    forgotten = await sessions.forgotten(ctx.session_id)
    count = f"{len(plan.seen) or 'no'} earlier turn{'s' * (len(plan.seen) != 1)}"
    if older:
        count += f": {span(1, older)} summarised by the sub-model, then the latest {len(turns)} whole"
    head = [f"The next turn sees {count}" + (", in this order:" if plan.seen else ".")]
    if plan.summary is not None:
        written = f"{plan.summary.model or 'the sub-model'}, {plan.summary.updated_at:%Y-%m-%d %H:%M} UTC"
        head.append(f"Summary of {span(1, plan.covered)} (written by {written}):")
        head.extend(f"    {line.strip()}" for line in plan.summary.text.splitlines() if line.strip())
    if plan.stale is not None:
        head.append("(the stored summary covers a turn since re-run or forgotten: the next turn rebuilds it)")
    if plan.covered < older:
        head.append(f"(the next turn first adds {span(plan.covered + 1, older)} to the summary)")
    if turns and len(plan.text()) > plan.window.chars:
        head.append(f"(the oldest text is cut to the history's {plan.window.chars} characters, [history] max_chars)")
    lines, rows = list(head), []
    for number, turn in enumerate(turns, older + 1):
        cell = f"cell {turn.cell_id[:8]}" if turn.cell_id else "no cell"
        task, answer = _line(turn.task), _line(turn.answer or "" if turn.status == "completed" else f"({turn.status})")
        lines.append(f"{number:>3}. {turn.turn_id}  {cell:<13}  {task} -> {answer}")
        rows.append(f"| {number} | `{turn.turn_id}` | {md(cell)} | {md(task)} | {md(answer)} |")
    markdown = "\n".join(f"> {md(line.strip())}" if line.startswith("    ") else md(line) for line in head)
    if rows:
        markdown += "\n\n| # | turn | cell | task | answer |\n|---|---|---|---|---|\n" + "\n".join(rows)
    if forgotten:
        note = "Forgotten (%fleet history restore <turn_id>): " + ", ".join(t.turn_id for t in forgotten)
        lines.append(note)
        markdown += "\n\n" + md(note)
    return Reply("\n".join(lines), markdown)


def _line(text: str, width: int = 60) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    line = " ".join(text.strip().split("\n", 1)[0].split())
    return line if len(line) <= width else line[: width - 3] + "..."
