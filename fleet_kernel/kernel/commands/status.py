"""``%fleet status`` (or ``usage``): the session, model, sandbox and store, and what the turns used."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_kernel.kernel.commands._base import Reply, command, md
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.sandbox import contract as sandbox_contract


@command(
    "status",
    "%fleet status | usage",
    "session, model, sandbox, store, what the turns used",
    order=70,
    aliases=("usage",),
)
async def cmd_status(ctx: KernelContext, args: list[str]) -> Reply:
    store = await ctx.opened_store()
    settings = ctx.settings
    sandbox = settings.sandbox or f"{await asyncio.to_thread(sandbox_contract.choose, settings)} (the default here)"
    lines = [
        f"session: {ctx.session_id or '(none yet)'}",
        f"model: {settings.lm_model or '(not configured)'}",
        f"sandbox: {sandbox}",
        f"output: {ctx.output_mode()}",
        f"skills: {', '.join(ctx.skills) or '(none preselected; %fleet skill use <name>)'}",
        f"store: {store.safe_url}",
        f"home: {settings.home}",
        f"engine loaded: {'yes' if ctx.warm.is_set() else 'loading'}",
    ]
    if ctx.session_id is not None:
        usage = await (await ctx.sessions()).usage(ctx.session_id)
        totals = usage.totals
        statuses = ", ".join(f"{status}: {count}" for status, count in usage.statuses.items())
        lines += [
            f"turns: {usage.turns} ({statuses or 'none'})",
            f"usage: {totals['lm_calls']} LM calls, {totals['prompt_tokens'] + totals['completion_tokens']:,} tokens "
            f"({totals['prompt_tokens']:,} in, {totals['completion_tokens']:,} out), ${totals['cost_usd']:.4f}",
        ]
        if usage.last is not None:
            lines.append(_last_turn_usage(usage.last))
    from fleet_kernel.telemetry import metrics  # loaded with the store by now (the kernel starts light)

    lines += metrics.summary_lines()  # the counters GET /metrics serves, for this kernel's turns
    return Reply("\n".join(lines), "\n".join(f"- {md(line)}" for line in lines))


def _last_turn_usage(usage: dict[str, Any]) -> str:
    """What the last turn used, against its budgets when it had them."""
    budgets = usage.get("budgets") or {}
    tokens = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
    line = f"last turn: {tokens:,} tokens"
    if budgets.get("max_turn_tokens"):
        line += f" of {budgets['max_turn_tokens']:,} (limits.max_turn_tokens)"
    line += f", ${usage.get('cost_usd') or 0:.4f}"
    if budgets.get("max_turn_cost_usd"):
        line += f" of ${budgets['max_turn_cost_usd']:.4f} (limits.max_turn_cost_usd)"
    return line
