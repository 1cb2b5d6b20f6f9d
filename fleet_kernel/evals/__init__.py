"""Measure what the model does: data sets of tasks, scorers, runs in fresh sessions, tables and reports.

``run_dataset`` is the one path every front door takes (``fleet eval``, ``%fleet eval``, the API): load
the data set, run it (``run.evaluate``), and save the results and the report in ``out``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fleet_kernel.engine import TurnRunner
from fleet_kernel.evals.dataset import EvalTask, append_row, load_dataset
from fleet_kernel.evals.run import EvalReport, Progress, RunResult, evaluate
from fleet_kernel.evals.scoring import Score, model_judge, score_answer

__all__ = [
    "EvalOutcome",
    "EvalReport",
    "EvalTask",
    "RunResult",
    "Score",
    "append_row",
    "evaluate",
    "load_dataset",
    "model_judge",
    "run_dataset",
    "run_tasks",
    "score_answer",
]


@dataclass(frozen=True)
class EvalOutcome:
    report: EvalReport
    files: list[Path]


async def run_dataset(
    runner: TurnRunner,
    dataset: Path,
    *,
    models: Sequence[str | None] = (None,),
    repeat: int = 1,
    concurrency: int = 1,
    judge_model: str | None = None,
    out: Path | None = None,
    progress: Progress | None = None,
) -> EvalOutcome:
    """Run ``dataset`` and write ``results.json``, ``results.csv``, ``report.ipynb`` and ``report.html`` to
    ``out`` (default: ``$FLEET_HOME/evals/<data set name>-<UTC time>``).

    Raises:
        ValidationError: a bad data set, repeat, concurrency or model (before anything runs).
        LMError: a rubric needs a judge and no judge model can be built.
    """
    tasks = await asyncio.to_thread(load_dataset, dataset)
    return await run_tasks(
        runner,
        tasks,
        dataset.stem,
        models=models,
        repeat=repeat,
        concurrency=concurrency,
        judge_model=judge_model,
        out=out,
        progress=progress,
    )


async def run_tasks(
    runner: TurnRunner,
    tasks: Sequence[EvalTask],
    name: str,
    *,
    models: Sequence[str | None] = (None,),
    repeat: int = 1,
    concurrency: int = 1,
    judge_model: str | None = None,
    out: Path | None = None,
    progress: Progress | None = None,
) -> EvalOutcome:
    """``run_dataset`` for tasks already loaded; ``name`` names the runs' sessions and the output folder."""
    from fleet_kernel.evals.report import write_report, write_results  # noqa: PLC0415 - nbconvert and rich load only when a report is written

    judge = None
    if any(t.scorer == "judge" for t in tasks):
        judge = await asyncio.to_thread(model_judge, runner.settings, judge_model)
    report = await evaluate(
        runner, tasks, models=models, repeat=repeat, concurrency=concurrency, judge=judge, name=name, progress=progress
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = out or runner.settings.home / "evals" / f"{name}-{stamp}"
    files = await asyncio.to_thread(write_results, report, folder)
    files += await write_report(report, runner.store, folder)
    return EvalOutcome(report, files)
