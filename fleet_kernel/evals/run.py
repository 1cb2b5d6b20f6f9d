"""Run every task of a data set on every model, ``repeat`` times, each run a fresh session of the store.

Each run is an ordinary session (titled ``eval <name>: <task id> · <model> · #<n>``) with one turn, so it
can be opened, continued and exported like any other. ``evaluate`` is what ``fleet eval``, ``%fleet eval``
and the API call; the printed table, the saved results and the report are made from its ``EvalReport``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.session_config import check_model
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.errors import FleetError, ValidationError
from fleet_kernel.evals.dataset import EvalTask
from fleet_kernel.evals.scoring import Judge, Score, score_answer
from fleet_kernel.transcript import turn_view

MAX_REPEAT = 100
MAX_CONCURRENCY = 32


@dataclass
class RunResult:
    """One task run once on one model, scored."""

    task_id: str
    model: str
    repeat: int
    session_id: str = ""
    turn_id: str = ""
    status: str = ""
    answer: str | None = None
    score: float = 0.0
    reason: str = ""
    iterations: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    error: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return self.score >= 1.0


@dataclass
class ModelSummary:
    """A model over the whole data set: the mean score, and its spread over the repeats."""

    model: str
    mean: float
    spread: float  # standard deviation of the per-repeat means (0 for one repeat)
    passed: int
    runs: int
    iterations: float
    tokens: int
    cost_usd: float
    duration_s: float


@dataclass
class EvalReport:
    name: str
    models: list[str]
    task_ids: list[str]
    repeat: int
    results: list[RunResult] = field(default_factory=list)

    def cell(self, task_id: str, model: str) -> float:
        """The task's mean score on the model over the repeats."""
        scores = [r.score for r in self.results if r.task_id == task_id and r.model == model]
        return statistics.fmean(scores) if scores else 0.0

    def summary(self) -> list[ModelSummary]:
        out = []
        for model in self.models:
            runs = [r for r in self.results if r.model == model]
            by_repeat = [statistics.fmean(r.score for r in runs if r.repeat == n) for n in range(1, self.repeat + 1)]
            out.append(
                ModelSummary(
                    model=model,
                    mean=statistics.fmean(by_repeat) if by_repeat else 0.0,
                    spread=statistics.pstdev(by_repeat) if len(by_repeat) > 1 else 0.0,
                    passed=sum(r.passed for r in runs),
                    runs=len(runs),
                    iterations=statistics.fmean(r.iterations for r in runs) if runs else 0.0,
                    tokens=sum(r.tokens for r in runs),
                    cost_usd=sum(r.cost_usd for r in runs),
                    duration_s=sum(r.duration_s for r in runs),
                )
            )
        return out

    def failures(self) -> list[RunResult]:
        return [r for r in self.results if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "models": self.models,
            "tasks": self.task_ids,
            "repeat": self.repeat,
            "summary": [asdict(s) for s in self.summary()],
            "results": [asdict(r) for r in self.results],
        }


Progress = Callable[[RunResult, int, int], None]
"""Called after each run with the result, how many runs are done and how many there are."""


async def evaluate(
    runner: TurnRunner,
    tasks: Sequence[EvalTask],
    *,
    models: Sequence[str | None] = (None,),
    repeat: int = 1,
    concurrency: int = 1,
    judge: Judge | None = None,
    name: str = "eval",
    progress: Progress | None = None,
) -> EvalReport:
    """Run each task on each model ``repeat`` times, at most ``concurrency`` at once, in fresh sessions.

    ``None`` as a model is the configured one (``FLEET_LM_MODEL``). A run that fails scores 0; nothing
    is lost when one does. ``concurrency`` is lowered to ``[sandbox] max_sandboxes`` when that is smaller.

    Raises:
        ValidationError: a repeat or concurrency out of range, or a model the operator does not allow
            (checked for every model before anything runs).
    """
    if not 1 <= repeat <= MAX_REPEAT:
        raise ValidationError(f"--repeat is from 1 to {MAX_REPEAT}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValidationError(f"--concurrency is from 1 to {MAX_CONCURRENCY}")
    for model in models:
        check_model(model, runner.settings)
    names = [model or runner.settings.lm_model or "(no model)" for model in models]
    if len(set(names)) != len(names):
        raise ValidationError("a model is named twice: give each --model once")
    report = EvalReport(name, names, [t.task_id for t in tasks], repeat)
    sessions = Sessions(runner.store, runner.settings)
    # no more runs at once than sandboxes may run ([sandbox] max_sandboxes): one more would fail, busy
    gate = asyncio.Semaphore(min(concurrency, runner.settings.policy.sandbox.sandbox_cap))
    jobs = [
        (t, m, label, n) for n in range(1, repeat + 1) for t in tasks for m, label in zip(models, names, strict=True)
    ]

    async def one(task: EvalTask, model: str | None, label: str, n: int) -> None:
        async with gate:
            result = await _run_one(runner, sessions, task, model, label, n, judge, name)
        report.results.append(result)
        if progress is not None:
            progress(result, len(report.results), len(jobs))

    await asyncio.gather(*(one(*job) for job in jobs))
    order = {(task.task_id, label, n): i for i, (task, _, label, n) in enumerate(jobs)}
    report.results.sort(key=lambda r: order[(r.task_id, r.model, r.repeat)])
    return report


async def _run_one(
    runner: TurnRunner,
    sessions: Sessions,
    task: EvalTask,
    model: str | None,
    label: str,
    n: int,
    judge: Judge | None,
    name: str,
) -> RunResult:
    result = RunResult(task.task_id, label, n)
    started = time.perf_counter()
    try:
        session = await sessions.create(f"eval {name}: {task.task_id} · {label} · #{n}"[:200])
        result.session_id = session.session_id
        if model is not None:
            await sessions.update(session.session_id, {"model": model})
        attachment_ids = []
        for path in task.attachments:
            attached = await sessions.attach(session.session_id, path.name, await sessions.read_file(path))
            attachment_ids.append(attached.attachment.attachment_id)
        turn = await runner.run(session.session_id, task.task, attachment_ids=attachment_ids, inputs=_inputs(task))
    except FleetError as exc:
        result.status, result.error = "failed", {"type": exc.code, "message": exc.message}
        result.reason, result.duration_s = exc.message, time.perf_counter() - started
        return result
    view = await turn_view(runner.store, turn)
    result.turn_id, result.status, result.answer, result.error = turn.turn_id, turn.status, turn.answer, turn.error
    result.iterations, result.tokens, result.cost_usd = len(view.iterations), view.tokens, view.cost_usd
    result.duration_s = (view.duration_ms or 0.0) / 1000 or time.perf_counter() - started
    if turn.status != "completed":
        score = Score(0.0, f"the turn {turn.status}: {(turn.error or {}).get('message', '')}".strip(": "))
    else:
        score = await asyncio.to_thread(_score, task, turn.answer, turn.result, judge)
    result.score, result.reason = score.value, score.reason
    return result


def _score(task: EvalTask, answer: str | None, value: Any, judge: Judge | None) -> Score:
    try:
        return score_answer(task, answer, value, judge)
    except Exception as exc:  # noqa: BLE001 - a judge that fails scores the run 0, with why
        return Score(0.0, f"scoring failed: {getattr(exc, 'message', exc)}"[:300])


def _inputs(task: EvalTask) -> list[Any]:
    if not task.inputs:
        return []
    from fleet_kernel.engine.inputs import check_name, encode  # noqa: PLC0415 - the engine's encoder (dspy) only for tasks with inputs

    for key in task.inputs:
        check_name(key)
    return [encode(key, value) for key, value in task.inputs.items()]
