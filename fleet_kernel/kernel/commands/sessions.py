"""``%fleet session``, ``attach`` and ``export``: which session the kernel continues, and its files in and out."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

from fleet_kernel.errors import NotFoundError
from fleet_kernel.kernel.commands._base import Reply, command, marked, md, usage_error
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.kernel.spec import NOTEBOOK_DIR_ENV


@command(
    "session",
    "%fleet session [new [title] | use <id> | list]",
    "show, start, continue or list sessions",
    order=20,
    words=("new", "use", "list"),
)
async def cmd_session(ctx: KernelContext, args: list[str]) -> Reply:
    action = args[0] if args else ""
    if action == "new":
        ctx.session_id = (await (await ctx.sessions()).create(" ".join(args[1:]))).session_id
        return Reply(f"New session {ctx.session_id}; the next cell is its first turn.")
    if action == "use":
        if len(args) != 2:
            raise usage_error("usage: %fleet session use <session_id> (see %fleet session list)")
        await ctx.use_session(args[1])
        session = await (await ctx.sessions()).get(args[1])
        return Reply(
            f"Using session {session.session_id} ({session.title or 'untitled'}, {session.turn_count} turns); "
            "its history feeds the next turn."
        )
    if action == "list":
        return await _list_sessions(ctx)
    if action:
        raise usage_error(f"unknown session action {action!r}: use new, use or list")
    if ctx.session_id is None:
        return Reply("No session yet: the first turn creates one (or %fleet session use <id>).")
    session = await (await ctx.sessions()).get(ctx.session_id)
    return Reply(f"Session {session.session_id}: {session.title or 'untitled'} ({session.turn_count} turns)")


async def _list_sessions(ctx: KernelContext) -> Reply:
    sessions = await (await ctx.sessions()).list(limit=50)
    if not sessions:
        return Reply("No sessions in the store yet.")
    lines, rows = [], []
    for s in sessions:
        mark = "*" if s.session_id == ctx.session_id else " "
        when = s.updated_at.strftime("%Y-%m-%d %H:%M")
        lines.append(f"{mark} {s.session_id}  {s.turn_count:>3} turns  {when}  {s.title}")
        rows.append(f"| {marked(f'`{s.session_id}`', mark == '*')} | {s.turn_count} | {when} | {md(s.title)} |")
    markdown = "| session | turns | updated | title |\n|---|---|---|---|\n" + "\n".join(rows)
    return Reply("\n".join(lines), markdown)


@command("attach", "%fleet attach <local file>", "copy a file into the session workspace (files/)", order=80)
async def cmd_attach(ctx: KernelContext, args: list[str]) -> Reply:
    if len(args) != 1:
        raise usage_error("usage: %fleet attach <local file>")
    source = Path(args[0]).expanduser()  # noqa: ASYNC240 - expanduser reads $HOME, no I/O
    sessions = await ctx.sessions()
    try:
        data = await sessions.read_file(source)
    except NotFoundError as exc:
        raise NotFoundError(exc.message + _cwd_hint(source)) from exc
    attached = await sessions.attach(await ctx.ensure_session(), source.name, data)
    row = attached.attachment
    taken = f"; files/ already held another {source.name}" if attached.renamed else ""
    return Reply(
        f"Attached {source.name} as /workspace/{row.path} ({row.size:,} bytes{taken}); "
        "the model sees it in /workspace/files."
    )


def _cwd_hint(source: Path) -> str:
    """For papermill without ``--cwd``: the kernel runs in papermill's folder, not the notebook's."""
    notebook_dir = os.environ.get(NOTEBOOK_DIR_ENV)
    if source.is_absolute() or not notebook_dir or Path(notebook_dir) == Path.cwd():
        return ""
    return f"; papermill runs cells in its own working folder: pass --cwd {shlex.quote(notebook_dir)}"


@command(
    "export",
    "%fleet export [file.ipynb | folder]",
    "write the session as a notebook (fleet-<title>-<id>.ipynb)",
    order=90,
)
async def cmd_export(ctx: KernelContext, args: list[str]) -> Reply:
    folder = bool(args) and await asyncio.to_thread(Path(args[0]).is_dir)
    if len(args) > 1 or (args and not args[0].endswith((".ipynb", "/")) and not folder):
        raise usage_error("usage: %fleet export [file.ipynb | folder] (default: a file named after the session)")
    if ctx.session_id is None:
        raise usage_error("nothing to export yet: run a turn first, or %fleet session use <id>")
    export = await (await ctx.sessions()).export(ctx.session_id)
    target = await asyncio.to_thread(export.write, Path(args[0] if args else ".").expanduser())  # noqa: ASYNC240 - expanduser reads $HOME, no I/O
    return Reply(f"Wrote {export.turns} turns of session {ctx.session_id} to {target.resolve()}")
