"""``fleet eval``: the engine's evaluation over the configured store, progress on stderr, the table on stdout."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleet_kernel.config import load_settings
from fleet_kernel.evals import EvalOutcome, run_dataset
from fleet_kernel.evals.report import render_table
from fleet_kernel.evals.run import RunResult

if TYPE_CHECKING:
    from fleet_kernel.engine import TurnRunner

T = TypeVar("T")


def _progress(result: RunResult, done: int, total: int) -> None:
    mark = "pass" if result.passed else "FAIL"
    run = f"{result.task_id} · {result.model} · #{result.repeat}"
    click.echo(f"[{done}/{total}] {mark} {run}: {result.score:.2f} {result.reason}"[:200], err=True)


async def _with_runner(work: Callable[[TurnRunner], Awaitable[T]]) -> T:
    """``work`` with a runner over the configured store, both closed after it."""
    from fleet_kernel.engine import TurnRunner
    from fleet_kernel.store import Store

    settings = load_settings()
    if settings.database_url.startswith("sqlite"):
        settings.home.mkdir(parents=True, exist_ok=True)
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    try:
        return await work(runner)
    finally:
        await runner.close()
        await store.close()


async def _run(dataset: Path, models: list[str], **options: Any) -> EvalOutcome:
    return await _with_runner(
        lambda runner: run_dataset(runner, dataset, models=models or [None], progress=_progress, **options)
    )


def run_eval(dataset: Path, models: list[str], **options: object) -> None:
    outcome = asyncio.run(_run(dataset, models, **options))
    click.echo(render_table(outcome.report, width=max(80, shutil.get_terminal_size((120, 24)).columns)))
    for path in outcome.files:
        click.echo(f"wrote {path}")


def run_optimize(dataset: Path, **options: Any) -> None:
    from fleet_kernel.evals.optimize import optimize

    outcome = asyncio.run(_with_runner(lambda runner: optimize(runner, dataset, progress=_progress, **options)))
    held = ", ".join(outcome.heldout)
    click.echo(f"held out: {held}; baseline {outcome.baseline:.2f}, candidate {outcome.candidate:.2f}")
    if outcome.instructions is not None:
        click.echo(f"adopted: wrote {outcome.instructions}; select it in fleet.toml with")
        click.echo(f'[lm]\ninstructions = "{outcome.instructions}"')
    else:
        click.echo("kept the baseline: the candidate did not score better on the held-out tasks")
