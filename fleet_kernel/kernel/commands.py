"""``%fleet`` commands: a table of small async functions, each answering one line of the cell.

    %fleet help                                      this list
    %fleet session [new [title] | use <id> | list]   show, start, continue or list sessions
    %fleet model [[default] name]                    show or set the session's root model (default: only if none is set)
    %fleet memory [search Q | forget ID]             the session's memories (what remember() kept), search, forget
    %fleet sandbox [name]                            show or set the sandbox backend for the next turns
    %fleet output [text|rich]                        how turns are shown
    %fleet status | usage                            session, model, sandbox, store, what the turns used
    %fleet attach <local file>                       copy a file into the session workspace (files/)
    %fleet export [file.ipynb | folder]              write the session as a notebook (fleet-<title>-<id>.ipynb)
    %fleet serve [port]                              start the HTTP API on this kernel's store
    %fleet set [name [value]]                        show or set a parameter: {name} in later cells is its value
    %fleet skill [list | show N | use N... | clear]  list skill cards, read one, put up to 4 in the next turns' prompt
    %fleet skill trust [off]                         use (or stop using) the cards of ./.fleet/skills of this folder
    %fleet tools                                     the host tools of fleet.toml ([[tools]], MCP) turns may call
    %fleet history [forget|restore <turn_id>]        what the next turn sees of earlier turns; take one out or back
    %fleet eval DATA [--model M].. [--repeat N]      score a data set on models (--concurrency K --judge M --out D)
    %fleet feedback [good|bad [note] | add F.jsonl]  show or mark the last turn's answer (--turn ID); add to a data set

A command raises ``FleetError`` with advice when it cannot do what was asked; the kernel renders it once.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_kernel.errors import FleetError, NotFoundError, ValidationError
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.kernel.spec import NOTEBOOK_DIR_ENV
from fleet_kernel.markdown import md_code, md_escape
from fleet_kernel.sandbox import contract as sandbox_contract
from fleet_kernel.textsafe import terminal_safe

if TYPE_CHECKING:
    from fleet_kernel.skills import Catalogue

PREFIX = "%fleet"
PARAMETER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|\{([A-Za-z_]\w*)\}")
"""``{name}`` of a set parameter is its value, ``{{name}}`` the literal ``{name}``; other braces stay as written."""
SANDBOXES = sandbox_contract.names()
OUTPUTS = ("rich", "text")


@dataclass
class Reply:
    """What a command shows: plain text for every frontend, Markdown where it renders."""

    text: str
    markdown: str | None = None


Handler = Callable[[KernelContext, list[str]], Awaitable[Reply]]


def _usage_error(message: str) -> Exception:

    return ValidationError(message, code="usage")


# ---------------------------------------------------------------------------------------------- commands


async def cmd_help(ctx: KernelContext, args: list[str]) -> Reply:
    doc = (__doc__ or "").split("\n\n")[1]
    text = "Fleet: each cell is a turn of the session; lines starting with %fleet are commands.\n\n" + doc
    lines = [line.strip() for line in doc.splitlines() if line.strip()]
    rows = []
    for line in lines:
        usage, _, what = line.partition("  ")
        rows.append(f"| {md_code(usage.strip())} | {_md(what.strip())} |")
    markdown = (
        "**Fleet commands** (each cell is a turn; `%fleet` lines are commands)\n\n"
        "| command | what it does |\n|---|---|\n"
    )
    return Reply(text, markdown + "\n".join(rows))


async def cmd_session(ctx: KernelContext, args: list[str]) -> Reply:
    action = args[0] if args else ""
    if action == "new":
        ctx.session_id = (await (await ctx.sessions()).create(" ".join(args[1:]))).session_id
        return Reply(f"New session {ctx.session_id}; the next cell is its first turn.")
    if action == "use":
        if len(args) != 2:
            raise _usage_error("usage: %fleet session use <session_id> (see %fleet session list)")
        await ctx.use_session(args[1])
        session = await (await ctx.sessions()).get(args[1])
        return Reply(
            f"Using session {session.session_id} ({session.title or 'untitled'}, {session.turn_count} turns); "
            "its history feeds the next turn."
        )
    if action == "list":
        return await _list_sessions(ctx)
    if action:
        raise _usage_error(f"unknown session action {action!r}: use new, use or list")
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
        rows.append(f"| {_marked(f'`{s.session_id}`', mark == '*')} | {s.turn_count} | {when} | {_md(s.title)} |")
    markdown = "| session | turns | updated | title |\n|---|---|---|---|\n" + "\n".join(rows)
    return Reply("\n".join(lines), markdown)


async def cmd_model(ctx: KernelContext, args: list[str]) -> Reply:
    if args[:1] == ["default"]:
        # A notebook meant to run anywhere names its fallback model: used only when none is configured.
        if len(args) != 2:
            raise _usage_error("usage: %fleet model default <name> (used only when FLEET_LM_MODEL is not set)")
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


async def cmd_memory(ctx: KernelContext, args: list[str]) -> Reply:
    action = args[0] if args else ""
    if action not in ("", "search", "forget") or (action == "forget" and len(args) != 2):
        raise _usage_error("usage: %fleet memory | %fleet memory search <words> | %fleet memory forget <memory_id>")
    if action == "search" and len(args) < 2:
        raise _usage_error("usage: %fleet memory search <words>")
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
    table = "\n".join(f"| `{r.memory_id}` | {r.kind} | {_md(' '.join(r.content.split()))} |" for r in rows)
    return Reply("\n".join(lines), "| memory | kind | content |\n|---|---|---|\n" + table)


async def cmd_sandbox(ctx: KernelContext, args: list[str]) -> Reply:
    if args:
        if args[0] not in SANDBOXES:
            raise _usage_error(f"unknown sandbox {args[0]!r}: use one of {', '.join(SANDBOXES)}")
        ctx.update_settings(sandbox=args[0])
        return Reply(f"The next turns run code in the {args[0]} sandbox.")
    if chosen := ctx.settings.sandbox:
        return Reply(f"Sandbox: {chosen}")
    return Reply(f"Sandbox: {await asyncio.to_thread(sandbox_contract.choose, ctx.settings)} (the default here)")


async def cmd_output(ctx: KernelContext, args: list[str]) -> Reply:
    if args:
        if args[0] not in OUTPUTS:
            raise _usage_error("usage: %fleet output text|rich")
        ctx.explicit_output = args[0]  # type: ignore[assignment]
    mode, live = ctx.output_mode(), ctx.live_mode()
    what = {"text": "text streams", "widgets": "a live widget card", "plain": "live displays"}[live]
    return Reply(f"Output: {mode}. Here, turns are shown as {what} ({live}), then as their transcript.")


async def cmd_status(ctx: KernelContext, args: list[str]) -> Reply:
    await ctx.open()
    assert ctx.store is not None
    settings = ctx.settings
    sandbox = settings.sandbox or f"{await asyncio.to_thread(sandbox_contract.choose, settings)} (the default here)"
    lines = [
        f"session: {ctx.session_id or '(none yet)'}",
        f"model: {settings.lm_model or '(not configured)'}",
        f"sandbox: {sandbox}",
        f"output: {ctx.output_mode()}",
        f"skills: {', '.join(ctx.skills) or '(none preselected; %fleet skill use <name>)'}",
        f"store: {ctx.store.safe_url}",
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
    return Reply("\n".join(lines), "\n".join(f"- {_md(line)}" for line in lines))


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


async def cmd_attach(ctx: KernelContext, args: list[str]) -> Reply:
    if len(args) != 1:
        raise _usage_error("usage: %fleet attach <local file>")
    source = Path(args[0]).expanduser()
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


async def cmd_export(ctx: KernelContext, args: list[str]) -> Reply:
    if len(args) > 1 or (args and not args[0].endswith((".ipynb", "/")) and not Path(args[0]).is_dir()):
        raise _usage_error("usage: %fleet export [file.ipynb | folder] (default: a file named after the session)")
    if ctx.session_id is None:
        raise _usage_error("nothing to export yet: run a turn first, or %fleet session use <id>")
    export = await (await ctx.sessions()).export(ctx.session_id)
    target = await asyncio.to_thread(export.write, Path(args[0] if args else ".").expanduser())
    return Reply(f"Wrote {export.turns} turns of session {ctx.session_id} to {target.resolve()}")


class Sidecar:
    """The API server this kernel started (one at most). Its own session: it keeps serving after the kernel exits."""

    process: subprocess.Popen[bytes] | None = None
    port: int = 0


async def cmd_serve(ctx: KernelContext, args: list[str]) -> Reply:
    from fleet_kernel.kernel.sidecar import spawn_sidecar  # subprocess plumbing only for %fleet serve

    settings = ctx.settings
    port = int(args[0]) if args and args[0].isdigit() else settings.policy.kernel.api_port
    if Sidecar.process is not None and Sidecar.process.poll() is None:
        return Reply(f"The API already runs at http://127.0.0.1:{Sidecar.port}/api (pid {Sidecar.process.pid}).")
    env = {"FLEET_HOME": str(settings.home), "FLEET_DATABASE_URL": settings.database_url}
    try:
        Sidecar.process = await asyncio.to_thread(spawn_sidecar, port, env=env, wait_s=15)
    except FleetError as exc:
        raise _serve_error(exc.message) from exc
    Sidecar.port = port
    pid = Sidecar.process.pid
    return Reply(
        f"The API serves this store at http://127.0.0.1:{port}/api (pid {pid}; it keeps serving after the kernel "
        f"exits, stop it with `kill {pid}`); log: {settings.logs_dir / f'api-{port}.log'}"
    )


def _serve_error(message: str) -> Exception:

    return FleetError(message, code="api_unavailable")


async def cmd_set(ctx: KernelContext, args: list[str]) -> Reply:
    if not args:
        if not ctx.params:
            return Reply("No parameters yet: %fleet set <name> <value>, then {name} in a later cell.")
        lines = [f"{name} = {value!r}" for name, value in ctx.params.items()]
        rows = [f"| `{name}` | {_md(value)} |" for name, value in ctx.params.items()]
        return Reply("\n".join(lines), "| parameter | value |\n|---|---|\n" + "\n".join(rows))
    name = args[0]
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise _usage_error(f"{name!r} is not a parameter name: use letters, digits and _ (not first a digit)")
    if len(args) == 1:
        if name not in ctx.params:
            raise _usage_error(f"no parameter {name!r}: set it with %fleet set {name} <value>")
        return Reply(f"{name} = {ctx.params[name]!r}")
    ctx.params[name] = " ".join(args[1:])
    return Reply(f"{name} = {ctx.params[name]!r}; {{{name}}} in the next cells is this value.")


async def cmd_history(ctx: KernelContext, args: list[str]) -> Reply:
    """What the next turn sees of earlier turns (``compaction.plan_history``, as the runner plans it): the
    session's summary of the older ones and the latest whole; or forget/restore one turn."""
    # the engine (store, SQLAlchemy) loads after the kernel starts
    from fleet_kernel.engine.compaction import span

    if args and (args[0] not in HISTORY_ACTIONS or len(args) != 2):
        raise _usage_error("usage: %fleet history [forget|restore <turn_id>] (turn ids are listed by %fleet history)")
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
        rows.append(f"| {number} | `{turn.turn_id}` | {_md(cell)} | {_md(task)} | {_md(answer)} |")
    markdown = "\n".join(f"> {_md(line.strip())}" if line.startswith("    ") else _md(line) for line in head)
    if rows:
        markdown += "\n\n| # | turn | cell | task | answer |\n|---|---|---|---|---|\n" + "\n".join(rows)
    if forgotten:
        note = "Forgotten (%fleet history restore <turn_id>): " + ", ".join(t.turn_id for t in forgotten)
        lines.append(note)
        markdown += "\n\n" + _md(note)
    return Reply("\n".join(lines), markdown)


EVAL_OPTIONS = {"--model": "models", "--repeat": "repeat", "--concurrency": "concurrency", "--judge": "judge_model"}
EVAL_USAGE = (
    "usage: %fleet eval DATA.jsonl|.csv|.ipynb [--model M].. [--repeat N] [--concurrency K] [--judge M] [--out DIR]"
)


def _eval_options(args: list[str]) -> dict[str, Any]:
    """``%fleet eval``'s words as ``evals.run_dataset`` arguments. Raises a usage error."""
    options: dict[str, Any] = {"models": []}
    words = iter(args)
    for word in words:
        value = next(words, None)
        if word not in (*EVAL_OPTIONS, "--out") or value is None:
            raise _usage_error(EVAL_USAGE)
        if word == "--model":
            options["models"].append(value)
        elif word == "--out":
            options["out"] = Path(value).expanduser()
        elif word in ("--repeat", "--concurrency"):
            if not value.isdigit():
                raise _usage_error(f"{word} takes a whole number; {EVAL_USAGE}")
            options[EVAL_OPTIONS[word]] = int(value)
        else:
            options[EVAL_OPTIONS[word]] = value
    options["models"] = options["models"] or [None]
    return options


async def cmd_tools(ctx: KernelContext, args: list[str]) -> Reply:
    """The host tools turns may call, as ``GET /api/tools`` lists them (listing starts the MCP servers)."""
    if args:
        raise _usage_error("usage: %fleet tools")
    runner = await ctx.open()
    lines = await asyncio.to_thread(runner.host_tools.describe)
    if not lines:
        return Reply("No host tools: add [[tools]] or [[mcp.servers]] to fleet.toml (docs/configuration.md).")
    return Reply("Host tools (fleet.toml):\n" + "\n".join(f"  {line}" for line in lines))


async def cmd_eval(ctx: KernelContext, args: list[str]) -> Reply:
    """Run a data set on each model, each run in a fresh session of this store (the kernel's session is kept)."""
    if not args or args[0].startswith("--"):
        raise _usage_error(EVAL_USAGE)
    options = _eval_options(args[1:])
    # the evaluation and its report (dspy, nbconvert) load only for this command
    from fleet_kernel.evals import RunResult, run_dataset
    from fleet_kernel.evals.report import markdown_table, render_table

    runner = await ctx.open()
    show = ctx.progress or (lambda _line: None)

    def progress(result: RunResult, done: int, total: int) -> None:
        mark = "pass" if result.passed else "FAIL"
        show(f"eval: {done}/{total} runs done · last {result.task_id} on {result.model} #{result.repeat}: {mark}")

    show("eval: starting the runs…")
    outcome = await run_dataset(runner, Path(args[0]).expanduser(), progress=progress, **options)
    files = [str(p.resolve()) for p in outcome.files]
    text = render_table(outcome.report, width=100) + "\n" + "\n".join(f"wrote {f}" for f in files)
    markdown = markdown_table(outcome.report) + "\n\n" + "\n".join(f"- wrote {md_code(f)}" for f in files)
    return Reply(text, markdown)


async def cmd_feedback(ctx: KernelContext, args: list[str]) -> Reply:
    """Mark a turn's answer (the session's last turn unless ``--turn``), show its mark, or add it to a data set."""
    from fleet_kernel.evals import feedback  # the store and the data sets load after the kernel starts

    turn_id = None
    if "--turn" in args:
        at = args.index("--turn")
        if at + 1 >= len(args):
            raise _usage_error("usage: --turn <turn_id> (turn ids are listed by %fleet history)")
        turn_id, args = args[at + 1], args[:at] + args[at + 2 :]
    if args and (args[0] not in FEEDBACK_ACTIONS or (args[0] == "add" and len(args) != 2)):
        raise _usage_error("usage: %fleet feedback [good|bad [note] | add DATA.jsonl] [--turn ID]")
    if ctx.session_id is None:
        raise _usage_error("no turn to mark yet: run a turn first, or %fleet session use <id>")
    sessions = await ctx.sessions()
    assert ctx.store is not None
    if turn_id is None:
        turns = await sessions.turns(ctx.session_id)
        if not turns:
            raise _usage_error("no turn to mark yet: run a turn first")
        turn_id = turns[-1].turn_id
    if not args:
        row = await sessions.feedback(ctx.session_id, turn_id)
        return Reply(f"Turn {turn_id} is marked {row.rating}" + (f": {row.note}" if row.note else "."))
    if args[0] == "add":
        target = Path(args[1]).expanduser()
        await feedback.add_to_dataset(ctx.store, ctx.session_id, turn_id, target)
        return Reply(f"Added turn {turn_id} to {target.resolve()}, its answer as the expected one.")
    row = await feedback.mark(ctx.store, ctx.session_id, turn_id, args[0], " ".join(args[1:]))
    return Reply(f"Marked turn {turn_id} {row.rating}" + (f": {row.note}" if row.note else "."))


FEEDBACK_ACTIONS = ("good", "bad", "add")


def _line(text: str, width: int = 60) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    line = " ".join(text.strip().split("\n", 1)[0].split())
    return line if len(line) <= width else line[: width - 3] + "..."


async def cmd_skill(ctx: KernelContext, args: list[str]) -> Reply:
    from fleet_kernel import skills  # the skill loader reads cards from disk only when asked

    action, names = (args[0], args[1:]) if args else ("list", [])
    if action == "trust":
        return await _skill_trust(ctx, names)
    catalogue = await asyncio.to_thread(skills.catalogue_for, ctx.settings)
    if action == "list":
        if names:
            raise _usage_error("usage: %fleet skill list")
        return _skill_list(ctx, catalogue)
    if action == "show":
        if len(names) != 1:
            raise _usage_error("usage: %fleet skill show <name> (see %fleet skill list)")
        skill = catalogue.get(names[0])
        resources = f"\n\nResources: {', '.join(skill.resources)}" if skill.resources else ""
        return _safe(
            Reply(
                f"{skill.name} ({skill.source}): {skill.description}\n\n{skill.body}{resources}",
                f"**{_md(skill.name)}** ({skill.source}): {_md(skill.description)}\n\n"
                f"{md_escape(skill.body)}{_md(resources)}",
            )
        )
    if action == "use":
        if not names:
            raise _usage_error("usage: %fleet skill use <name>... (up to 4; %fleet skill clear to stop)")
        ctx.skills = catalogue.select(names)
        return Reply(f"The next turns have these skills in their prompt: {', '.join(ctx.skills)}.")
    if action == "clear":
        ctx.skills = ()
        return Reply("No skills are preselected; every turn still sees the list and can load_skill(name).")
    raise _usage_error(f"unknown skill action {action!r}: use list, show, use, clear or trust")


def _skill_list(ctx: KernelContext, catalogue: Catalogue) -> Reply:
    """The cards (the selected ones marked), then every warning: skipped cards, name clashes, an untrusted folder."""
    chosen = set(ctx.skills)
    lines = [f"{'*' if s.name in chosen else ' '} {s.name} ({s.source}): {s.description}" for s in catalogue]
    rows = [f"| {_marked(f'`{s.name}`', s.name in chosen)} | {s.source} | {_md(s.description)} |" for s in catalogue]
    note = f"Selected for the next turns: {', '.join(ctx.skills)}" if ctx.skills else "None selected."
    warnings = [f"Warning: {w}" for w in catalogue.warnings]
    markdown = "| skill | source | description |\n|---|---|---|\n" + "\n".join(rows) + f"\n\n{note}"
    markdown += "".join(f"\n\n{_md(w)}" for w in warnings)
    return _safe(Reply("\n".join([*lines, note, *warnings]), markdown))


async def _skill_trust(ctx: KernelContext, args: list[str]) -> Reply:
    """``%fleet skill trust [off]``: use (or stop using) the cards of this folder's ./.fleet/skills."""
    from fleet_kernel import skills

    if args not in ([], ["off"]):
        raise _usage_error("usage: %fleet skill trust [off] (use, or stop using, the cards of ./.fleet/skills)")
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


COMMANDS: dict[str, Handler] = {
    "help": cmd_help,
    "session": cmd_session,
    "model": cmd_model,
    "memory": cmd_memory,
    "sandbox": cmd_sandbox,
    "output": cmd_output,
    "status": cmd_status,
    "usage": cmd_status,
    "attach": cmd_attach,
    "export": cmd_export,
    "serve": cmd_serve,
    "set": cmd_set,
    "skill": cmd_skill,
    "history": cmd_history,
    "tools": cmd_tools,
    "eval": cmd_eval,
    "feedback": cmd_feedback,
}
HISTORY_ACTIONS = ("forget", "restore")
SUBCOMMANDS = {
    "session": ("new", "use", "list"),
    "output": OUTPUTS,
    "sandbox": SANDBOXES,
    "model": ("default",),
    "history": HISTORY_ACTIONS,
    "skill": ("list", "show", "use", "clear", "trust"),
    "memory": ("search", "forget"),
    "feedback": FEEDBACK_ACTIONS,
}


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
        raise _usage_error(f"cannot read the command: {exc}") from exc
    name, args = (words[0], words[1:]) if words else ("help", [])
    handler = COMMANDS.get(name)
    if handler is None:
        raise _usage_error(f"unknown command %fleet {name}: see %fleet help")
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


def _md(text: str) -> str:
    """Our text or the user's in a Markdown output: shown as written (``md_escape``)."""
    return md_escape(text, literal=True)


def _marked(cell: str, marked: bool) -> str:
    """A table cell in bold when it is the current or chosen one (``**`` around the whole cell, code and all)."""
    return f"**{cell}**" if marked else cell
