"""``%fleet`` commands: one module per group of commands, each command a small async function.

A command is registered where it is written, with its line of ``%fleet help`` and the words completed
after it::

    @command("tools", "%fleet tools", "the host tools of fleet.toml ([[tools]], MCP) turns may call", order=130)
    async def cmd_tools(ctx: KernelContext, args: list[str]) -> Reply: ...

Every module of this package whose name does not start with ``_`` is loaded here, so a new command is
one function in one module (a new module included); the kernel and the ``%%fleet`` magic both dispatch
through ``COMMANDS``. Commands parse their words and render the answer; what they do to sessions goes
through the engine's services (``KernelContext.sessions()``), never the store. A command raises
``FleetError`` with advice when it cannot do what was asked; the kernel renders it once.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import re
import shlex
from pathlib import Path

from fleet_kernel.kernel.commands._base import PREFIX, Handler, Reply, help_lines, md, registered, usage_error
from fleet_kernel.kernel.commands.help import cmd_help  # what the kernel shows for a lone ``%fleet`` too
from fleet_kernel.kernel.context import KernelContext

__all__ = ["COMMANDS", "PREFIX", "SUBCOMMANDS", "Handler", "Reply", "cmd_help", "complete", "help_lines", "is_command"]
__all__ += ["md", "run_line", "substitute"]

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

COMMANDS: dict[str, Handler] = {name: c.handler for c in registered() for name in c.names}
SUBCOMMANDS: dict[str, tuple[str, ...]] = {c.names[0]: c.words for c in registered() if c.words}
PARAMETER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")
"""``{name}`` of a set parameter is its value, ``{{name}}`` the literal ``{name}``; other braces stay as written."""


# ---------------------------------------------------------------------------------------------- dispatch


def substitute(params: dict[str, str], text: str) -> str:
    """Each ``{name}`` of a set parameter becomes its value, and ``{{name}}`` becomes ``{name}``."""

    def value(match: re.Match[str]) -> str:
        escaped, name = match.groups()
        if escaped is not None:
            return "{" + escaped + "}" if escaped in params else match.group(0)
        return params.get(name, match.group(0))

    return PARAMETER.sub(value, text) if params else text


def is_command(code: str) -> bool:
    return code.lstrip().startswith(PREFIX)


async def run_line(ctx: KernelContext, line: str) -> Reply:
    """Run one ``%fleet ...`` line. Raises ``FleetError`` (usage errors included)."""
    try:
        words = shlex.split(line.strip()[len(PREFIX) :])
    except ValueError as exc:
        raise usage_error(f"cannot read the command: {exc}") from exc
    name, args = (words[0], words[1:]) if words else ("help", [])
    handler = COMMANDS.get(name)
    if handler is None:
        raise usage_error(f"unknown command %fleet {name}: see %fleet help")
    return await handler(ctx, args)


async def complete(ctx: KernelContext, code: str, cursor_pos: int) -> tuple[list[str], int, int]:
    """Completions for ``%fleet`` lines: ``(matches, cursor_start, cursor_end)``."""
    line_start = code.rfind("\n", 0, cursor_pos) + 1
    line = code[line_start:cursor_pos]
    word = "" if line.endswith(" ") else line.rsplit(" ", 1)[-1]
    word_start = cursor_pos - len(word)
    words = line.split()
    if not line.startswith(PREFIX) or (len(words) == 1 and not line.endswith(" ")):
        matches = [PREFIX] if PREFIX.startswith(line) and line else []
        return matches, line_start, cursor_pos
    done = words[1:] if line.endswith(" ") else words[1:-1]
    options: list[str] = []
    if not done:
        options = list(COMMANDS)
    elif done[0] in SUBCOMMANDS and len(done) == 1:
        options = list(SUBCOMMANDS[done[0]])
    elif done[:2] == ["session", "use"] and len(done) == 2:
        options = [s.session_id for s in await (await ctx.sessions()).list(limit=100)]
    elif done == ["set"]:
        options = list(ctx.params)
    elif done[:2] in (["skill", "show"], ["skill", "use"]) and (done[1] == "use" or len(done) == 2):
        from fleet_kernel.skills import catalogue_for  # the skill loader reads cards from disk only when asked

        options = sorted((await asyncio.to_thread(catalogue_for, ctx.settings)).skills)
    elif done == ["attach"] or done == ["export"]:
        options = _paths(word)
    return [o for o in options if o.startswith(word)], word_start, cursor_pos


def _paths(prefix: str) -> list[str]:
    folder, _, _ = prefix.rpartition("/")
    base = Path(folder or ".").expanduser()
    try:
        entries = sorted(base.iterdir())[:200]
    except OSError:
        return []
    head = f"{folder}/" if folder else ""
    return [f"{head}{e.name}{'/' if e.is_dir() else ''}" for e in entries if not e.name.startswith(".")]
