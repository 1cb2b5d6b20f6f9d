"""``%fleet skill``: list, read and preselect skill cards, and trust a folder's own."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fleet_kernel.kernel.commands._base import Reply, command, marked, md, usage_error
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.markdown import md_escape
from fleet_kernel.textsafe import terminal_safe

if TYPE_CHECKING:
    from fleet_kernel.skills import Catalogue


@command(
    "skill",
    "%fleet skill [list | show N | use N... | clear]",
    "list skill cards, read one, put up to 4 in the next turns' prompt",
    order=120,
    words=("list", "show", "use", "clear", "trust"),
    more_help=(("%fleet skill trust [off]", "use (or stop using) the cards of ./.fleet/skills of this folder"),),
)
async def cmd_skill(ctx: KernelContext, args: list[str]) -> Reply:
    from fleet_kernel import skills  # the skill loader reads cards from disk only when asked

    action, names = (args[0], args[1:]) if args else ("list", [])
    if action == "trust":
        return await _skill_trust(ctx, names)
    catalogue = await asyncio.to_thread(skills.catalogue_for, ctx.settings)
    if action == "list":
        if names:
            raise usage_error("usage: %fleet skill list")
        return _skill_list(ctx, catalogue)
    if action == "show":
        if len(names) != 1:
            raise usage_error("usage: %fleet skill show <name> (see %fleet skill list)")
        skill = catalogue.get(names[0])
        resources = f"\n\nResources: {', '.join(skill.resources)}" if skill.resources else ""
        return _safe(
            Reply(
                f"{skill.name} ({skill.source}): {skill.description}\n\n{skill.body}{resources}",
                f"**{md(skill.name)}** ({skill.source}): {md(skill.description)}\n\n"
                f"{md_escape(skill.body)}{md(resources)}",
            )
        )
    if action == "use":
        if not names:
            raise usage_error("usage: %fleet skill use <name>... (up to 4; %fleet skill clear to stop)")
        ctx.skills = catalogue.select(names)
        return Reply(f"The next turns have these skills in their prompt: {', '.join(ctx.skills)}.")
    if action == "clear":
        ctx.skills = ()
        return Reply("No skills are preselected; every turn still sees the list and can load_skill(name).")
    raise usage_error(f"unknown skill action {action!r}: use list, show, use, clear or trust")


def _skill_list(ctx: KernelContext, catalogue: Catalogue) -> Reply:
    """The cards (the selected ones marked), then every warning: skipped cards, name clashes, an untrusted folder."""
    chosen = set(ctx.skills)
    lines = [f"{'*' if s.name in chosen else ' '} {s.name} ({s.source}): {s.description}" for s in catalogue]
    rows = [f"| {marked(f'`{s.name}`', s.name in chosen)} | {s.source} | {md(s.description)} |" for s in catalogue]
    note = f"Selected for the next turns: {', '.join(ctx.skills)}" if ctx.skills else "None selected."
    warnings = [f"Warning: {w}" for w in catalogue.warnings]
    markdown = "| skill | source | description |\n|---|---|---|\n" + "\n".join(rows) + f"\n\n{note}"
    markdown += "".join(f"\n\n{md(w)}" for w in warnings)
    return _safe(Reply("\n".join([*lines, note, *warnings]), markdown))


async def _skill_trust(ctx: KernelContext, args: list[str]) -> Reply:
    """``%fleet skill trust [off]``: use (or stop using) the cards of this folder's ./.fleet/skills."""
    from fleet_kernel import skills

    if args not in ([], ["off"]):
        raise usage_error("usage: %fleet skill trust [off] (use, or stop using, the cards of ./.fleet/skills)")
    home = ctx.settings.home
    if args == ["off"]:
        folder, was = await asyncio.to_thread(skills.distrust_project, home)
        done = "No longer trusted" if was else "It was not trusted"
        return _safe(Reply(f"{done}: {folder}. Its cards are not used."))
    folder, names = await asyncio.to_thread(skills.trust_project, home)
    return _safe(
        Reply(
            f"Trusted {folder} with its cards as they are now ({', '.join(names)}; kept in {home}). The next turns "
            "use them, never in place of a bundled card or your own of the same name. When a card changes, "
            "read it and trust the folder again; %fleet skill trust off stops it."
        )
    )


def _safe(reply: Reply) -> Reply:
    """A reply with card text in it, terminal escapes shown inert (a card may come from anywhere)."""
    return Reply(terminal_safe(reply.text), None if reply.markdown is None else terminal_safe(reply.markdown))
