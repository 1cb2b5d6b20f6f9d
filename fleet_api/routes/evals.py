"""Evaluations over HTTP: the engine's ``fleet eval`` on data set rows sent in the body, answered when done."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body

from fleet_api.deps import State
from fleet_api.routes._docs import errors
from fleet_api.schemas import EVAL_EXAMPLES, EvalCreate, EvalResult
from fleet_kernel.errors import ValidationError
from fleet_kernel.evals import run_tasks
from fleet_kernel.evals.dataset import task_of, unique_ids

router = APIRouter(tags=["evals"])

MAX_RUNS = 1000  # tasks x models x repeat of one request: a request may not start more turns than this


@router.post("/evals", response_model=EvalResult, responses=errors())
async def create_eval(body: Annotated[EvalCreate, Body(openapi_examples=EVAL_EXAMPLES)], state: State) -> EvalResult:
    """Run every task on every model ``repeat`` times, each run in a fresh session, and score the answers.

    The response comes when every run has ended; the runs' sessions stay in the store, and the results and
    report are also written under ``$FLEET_HOME/evals/``.
    """
    runs = len(body.tasks) * max(1, len(body.models)) * body.repeat
    if runs > MAX_RUNS:
        raise ValidationError(f"this evaluation is {runs} runs; one request may start at most {MAX_RUNS}")
    tasks = []
    for n, row in enumerate(body.tasks, 1):
        if row.get("attachments"):
            raise ValidationError(f"task {n}: attachments are not taken over HTTP; run the data set with fleet eval")
        tasks.append(task_of(row, f"task {n}", Path.cwd()))
    outcome = await run_tasks(
        state.runner,
        unique_ids(tasks, "tasks"),
        body.name,
        models=body.models or [None],
        repeat=body.repeat,
        concurrency=body.concurrency,
        judge_model=body.judge,
    )
    return EvalResult.model_validate(outcome.report.to_dict())
