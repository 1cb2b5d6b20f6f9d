"""``fleet eval``: the engine's evaluation over the configured store, progress on stderr, the table on stdout."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import click

from fleet_kernel.config import load_settings
from fleet_kernel.evals import EvalOutcome, run_dataset
from fleet_kernel.evals.report import render_table
from fleet_kernel.evals.run import RunResult


def _progress(result: RunResult, done: int, total: int) -> None:
    mark = "pass" if result.passed else "FAIL"
    run = f"{result.task_id} · {result.model} · #{result.repeat}"
    click.echo(f"[{done}/{total}] {mark} {run}: {result.score:.2f} {result.reason}"[:200], err=True)


async def _run(dataset: Path, models: list[str], **options: object) -> EvalOutcome:
    from fleet_kernel.engine import TurnRunner
    from fleet_kernel.store import Store

    settings = load_settings()
    if settings.database_url.startswith("sqlite"):
        settings.home.mkdir(parents=True, exist_ok=True)
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    try:
        return await run_dataset(runner, dataset, models=models or [None], progress=_progress, **options)  # type: ignore[arg-type]
    finally:
        await runner.close()
        await store.close()


def run_eval(dataset: Path, models: list[str], **options: object) -> None:
    outcome = asyncio.run(_run(dataset, models, **options))
    click.echo(render_table(outcome.report, width=max(80, shutil.get_terminal_size((120, 24)).columns)))
    for path in outcome.files:
        click.echo(f"wrote {path}")
