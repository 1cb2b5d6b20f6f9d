"""``%fleet eval`` and ``%fleet feedback``: score a data set on models; mark answers and keep them as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet_kernel.kernel.commands._base import Reply, command, usage_error
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.markdown import md_code

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
            raise usage_error(EVAL_USAGE)
        if word == "--model":
            options["models"].append(value)
        elif word == "--out":
            options["out"] = Path(value).expanduser()
        elif word in ("--repeat", "--concurrency"):
            if not value.isdigit():
                raise usage_error(f"{word} takes a whole number; {EVAL_USAGE}")
            options[EVAL_OPTIONS[word]] = int(value)
        else:
            options[EVAL_OPTIONS[word]] = value
    options["models"] = options["models"] or [None]
    return options


@command(
    "eval",
    "%fleet eval DATA [--model M].. [--repeat N]",
    "score a data set on models (--concurrency K --judge M --out D)",
    order=150,
)
async def cmd_eval(ctx: KernelContext, args: list[str]) -> Reply:
    """Run a data set on each model, each run in a fresh session of this store (the kernel's session is kept)."""
    if not args or args[0].startswith("--"):
        raise usage_error(EVAL_USAGE)
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
    outcome = await run_dataset(runner, Path(args[0]).expanduser(), progress=progress, **options)  # noqa: ASYNC240 - expanduser reads $HOME, no I/O
    files = [str(p.resolve()) for p in outcome.files]
    text = render_table(outcome.report, width=100) + "\n" + "\n".join(f"wrote {f}" for f in files)
    markdown = markdown_table(outcome.report) + "\n\n" + "\n".join(f"- wrote {md_code(f)}" for f in files)
    return Reply(text, markdown)


FEEDBACK_ACTIONS = ("good", "bad", "add")


@command(
    "feedback",
    "%fleet feedback [good|bad [note] | add F.jsonl]",
    "show or mark the last turn's answer (--turn ID); add to a data set",
    order=160,
    words=FEEDBACK_ACTIONS,
)
async def cmd_feedback(ctx: KernelContext, args: list[str]) -> Reply:
    """Mark a turn's answer (the session's last turn unless ``--turn``), show its mark, or add it to a data set."""
    from fleet_kernel.evals import feedback  # the store and the data sets load after the kernel starts

    turn_id = None
    if "--turn" in args:
        at = args.index("--turn")
        if at + 1 >= len(args):
            raise usage_error("usage: --turn <turn_id> (turn ids are listed by %fleet history)")
        turn_id, args = args[at + 1], args[:at] + args[at + 2 :]
    if args and (args[0] not in FEEDBACK_ACTIONS or (args[0] == "add" and len(args) != 2)):
        raise usage_error("usage: %fleet feedback [good|bad [note] | add DATA.jsonl] [--turn ID]")
    if ctx.session_id is None:
        raise usage_error("no turn to mark yet: run a turn first, or %fleet session use <id>")
    sessions = await ctx.sessions()
    store = await ctx.opened_store()
    if turn_id is None:
        turns = await sessions.turns(ctx.session_id)
        if not turns:
            raise usage_error("no turn to mark yet: run a turn first")
        turn_id = turns[-1].turn_id
    if not args:
        row = await sessions.feedback(ctx.session_id, turn_id)
        return Reply(f"Turn {turn_id} is marked {row.rating}" + (f": {row.note}" if row.note else "."))
    if args[0] == "add":
        target = Path(args[1]).expanduser()  # noqa: ASYNC240 - expanduser reads $HOME, no I/O
        await feedback.add_to_dataset(store, ctx.session_id, turn_id, target)
        return Reply(f"Added turn {turn_id} to {target.resolve()}, its answer as the expected one.")
    row = await feedback.mark(store, ctx.session_id, turn_id, args[0], " ".join(args[1:]))
    return Reply(f"Marked turn {turn_id} {row.rating}" + (f": {row.note}" if row.note else "."))
