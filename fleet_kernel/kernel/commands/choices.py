"""``%fleet model``, ``sandbox``, ``output`` and ``set``: what the next turns use, and how they are shown."""

from __future__ import annotations

import asyncio
import re

from fleet_kernel.kernel.commands._base import Reply, command, md, usage_error
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.sandbox import contract as sandbox_contract

SANDBOXES = sandbox_contract.names()

OUTPUTS = ("rich", "text")


@command(
    "model",
    "%fleet model [[default] name]",
    "show or set the session's root model (default: only if none is set)",
    order=30,
    words=("default",),
)
async def cmd_model(ctx: KernelContext, args: list[str]) -> Reply:
    if args[:1] == ["default"]:
        # A notebook meant to run anywhere names its fallback model: used only when none is configured.
        if len(args) != 2:
            raise usage_error("usage: %fleet model default <name> (used only when FLEET_LM_MODEL is not set)")
        if ctx.settings.lm_model:
            return Reply(f"The next turns use {ctx.settings.lm_model} (the configured model; {args[1]} is not needed).")
        args = args[1:]
    if args:
        settings = ctx.choose_model(args[0])
        sessions = await ctx.sessions()
        await sessions.choose_model(await ctx.ensure_session(), args[0])  # the API shows it too
        return Reply(f"The next turns use {settings.lm_model}.")
    settings = ctx.settings
    if ctx.session_id is not None:
        settings = await (await ctx.sessions()).settings_for(ctx.session_id)
    sub = settings.sub_lm_model or "the root model"
    where = f" at {settings.lm_base_url}" if settings.lm_base_url else ""
    model = settings.lm_model or "none (set FLEET_LM_MODEL, or %fleet model <name>)"
    return Reply(f"Model: {model}{where}; sub-LM: {sub}")


@command(
    "sandbox", "%fleet sandbox [name]", "show or set the sandbox backend for the next turns", order=50, words=SANDBOXES
)
async def cmd_sandbox(ctx: KernelContext, args: list[str]) -> Reply:
    if args:
        if args[0] not in SANDBOXES:
            raise usage_error(f"unknown sandbox {args[0]!r}: use one of {', '.join(SANDBOXES)}")
        ctx.update_settings(sandbox=args[0])
        return Reply(f"The next turns run code in the {args[0]} sandbox.")
    if chosen := ctx.settings.sandbox:
        return Reply(f"Sandbox: {chosen}")
    return Reply(f"Sandbox: {await asyncio.to_thread(sandbox_contract.choose, ctx.settings)} (the default here)")


@command("output", "%fleet output [text|rich]", "how turns are shown", order=60, words=OUTPUTS)
async def cmd_output(ctx: KernelContext, args: list[str]) -> Reply:
    if args:
        if args[0] not in OUTPUTS:
            raise usage_error("usage: %fleet output text|rich")
        ctx.explicit_output = args[0]  # type: ignore[assignment]
    mode, live = ctx.output_mode(), ctx.live_mode()
    what = {"text": "text streams", "widgets": "a live widget card", "plain": "live displays"}[live]
    return Reply(f"Output: {mode}. Here, turns are shown as {what} ({live}), then as their transcript.")


@command("set", "%fleet set [name [value]]", "show or set a parameter: {name} in later cells is its value", order=110)
async def cmd_set(ctx: KernelContext, args: list[str]) -> Reply:
    if not args:
        if not ctx.params:
            return Reply("No parameters yet: %fleet set <name> <value>, then {name} in a later cell.")
        lines = [f"{name} = {value!r}" for name, value in ctx.params.items()]
        rows = [f"| `{name}` | {md(value)} |" for name, value in ctx.params.items()]
        return Reply("\n".join(lines), "| parameter | value |\n|---|---|\n" + "\n".join(rows))
    name = args[0]
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise usage_error(f"{name!r} is not a parameter name: use letters, digits and _ (not first a digit)")
    if len(args) == 1:
        if name not in ctx.params:
            raise usage_error(f"no parameter {name!r}: set it with %fleet set {name} <value>")
        return Reply(f"{name} = {ctx.params[name]!r}")
    ctx.params[name] = " ".join(args[1:])
    return Reply(f"{name} = {ctx.params[name]!r}; {{{name}}} in the next cells is this value.")
