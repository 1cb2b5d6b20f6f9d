"""``fleet optimize``: GEPA over the instructions of Fleet's RLM, scored by running real turns on a data set.

The data set is split once (seeded) into a training part, which GEPA evolves the instructions on, and a
held-out part, which decides: the baseline (the instructions in use) and GEPA's best candidate each run
every held-out task, and the candidate is adopted only when its mean score there is higher. An adopted
candidate is written as the next ``instructions-v<N>.md`` of the output folder, for ``[lm] instructions``
in ``fleet.toml``; every attempt, adopted or not, is a line of ``history.jsonl`` with both scores. These files
are written without following a link planted in the folder (``safe_files``), and a folder or history that is a
link is refused before any task runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet_kernel import safe_files
from fleet_kernel.config import Settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import ConfigError, ValidationError
from fleet_kernel.evals.dataset import EvalTask, load_dataset
from fleet_kernel.evals.run import Progress, RunResult, evaluate
from fleet_kernel.evals.scoring import Judge, model_judge

COMPONENT = "instructions"


@dataclass(frozen=True)
class OptimizeOutcome:
    baseline: float  # mean score of the instructions in use on the held-out tasks
    candidate: float  # and of GEPA's best candidate
    adopted: bool
    instructions: Path | None  # the new versioned file, when adopted
    train: list[str]
    heldout: list[str]
    candidate_text: str


def split(tasks: Sequence[EvalTask], holdout: float, seed: int) -> tuple[list[EvalTask], list[EvalTask]]:
    """A seeded split with at least one task on each side. Raises ``ValidationError``."""
    if len(tasks) < 2:
        raise ValidationError("fleet optimize needs at least 2 tasks: some to train on and some held out")
    if not 0 < holdout < 1:
        raise ValidationError("--holdout is a fraction between 0 and 1, such as 0.3")
    order = list(tasks)
    random.Random(seed).shuffle(order)  # noqa: S311 - a seeded, reproducible split, not a secret
    held = min(len(order) - 1, max(1, round(len(order) * holdout)))
    return order[held:], order[:held]


class _Candidates:
    """One runner per candidate text (its ``[lm] instructions`` a file of that text), on the caller's loop."""

    def __init__(self, runner: TurnRunner, folder: Path, judge: Judge | None, name: str, concurrency: int) -> None:
        self.runner, self.folder, self.judge, self.name, self.concurrency = runner, folder, judge, name, concurrency
        self._runners: dict[str, TurnRunner] = {}

    def file_of(self, text: str) -> Path:
        relative = f"candidates/{hashlib.sha256(text.encode()).hexdigest()[:16]}.md"
        safe_files.write_path(self.folder, relative, text.encode("utf-8"))  # a link there is replaced, not followed
        return self.folder / relative

    async def score(self, text: str, tasks: Sequence[EvalTask], progress: Progress | None = None) -> list[RunResult]:
        """Run ``tasks`` with ``text`` as the instructions; results in the order of ``tasks``."""
        runner = self._runners.get(text)
        if runner is None:
            settings = _with_instructions(self.runner.settings, self.file_of(text))
            runner = self._runners[text] = await TurnRunner(self.runner.store, settings).open()
        report = await evaluate(
            runner, tasks, judge=self.judge, name=self.name, concurrency=self.concurrency, progress=progress
        )
        return report.results

    async def close(self) -> None:
        for runner in self._runners.values():
            await runner.close()


def _with_instructions(settings: Settings, path: Path) -> Settings:
    lm = settings.policy.lm.model_copy(update={"instructions": path})
    return settings.model_copy(update={"policy": settings.policy.model_copy(update={"lm": lm})})


class _FleetAdapter:
    """GEPA's adapter: a candidate is ``{"instructions": text}``; evaluating it runs Fleet turns."""

    def __init__(self, run: Callable[[str, Sequence[EvalTask]], list[RunResult]]) -> None:
        self._run = run

    def evaluate(self, batch: list[EvalTask], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch  # noqa: PLC0415 - gepa only while optimizing

        results = self._run(candidate[COMPONENT], batch)
        traces = [{"task": t, "result": r} for t, r in zip(batch, results, strict=True)] if capture_traces else None
        return EvaluationBatch(
            outputs=[r.answer for r in results], scores=[r.score for r in results], trajectories=traces
        )

    def make_reflective_dataset(
        self,
        candidate: dict[str, str],  # noqa: ARG002 - gepa's adapter signature
        eval_batch: Any,
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for trace in eval_batch.trajectories or []:
            task, result = trace["task"], trace["result"]
            expected = f" The expected answer: {task.expected}." if task.expected is not None else ""
            rows.append(
                {
                    "Inputs": {"task": task.task},
                    "Generated Outputs": {"answer": result.answer or f"(the turn {result.status})"},
                    "Feedback": f"Score {result.score:.2f}: {result.reason}.{expected}",
                }
            )
        return {name: rows for name in components_to_update}

    propose_new_texts = None


def _reflection(settings: Settings, model: str | None) -> Callable[[str], str]:
    """The model GEPA asks for new instructions: ``model``, else the configured root model."""
    from fleet_kernel.engine.lm import build_lms  # noqa: PLC0415 - dspy only while optimizing

    lm, _ = build_lms(settings.model_copy(update={"lm_model": model or settings.lm_model, "sub_lm_model": None}))

    def reflect(prompt: str) -> str:
        out = lm(prompt)[0]
        return str(out["text"] if isinstance(out, dict) else out)

    return reflect


def _open_history(home: Path, out: Path | None) -> tuple[Path, int]:
    """The output folder (``out``, else ``$FLEET_HOME/instructions``) and a descriptor appending to its
    ``history.jsonl``, both opened without following a link (the default folder made owner-only).

    Raises:
        ConfigError: the folder or its history is a link, not a folder or file, or another user's.
    """
    folder = out.resolve() if out is not None else home / "instructions"  # a link the user named is theirs
    try:
        if out is None:
            with safe_files.private_dirs(home, ["instructions"]) as fd:
                return folder, safe_files.open_append(fd, "history.jsonl")
        folder.mkdir(parents=True, exist_ok=True)
        with safe_files.open_dir(folder) as fd:
            return folder, safe_files.open_append(fd, "history.jsonl")
    except OSError as exc:
        raise ConfigError(
            f"fleet optimize will not write {folder / 'history.jsonl'}: {exc.strerror or exc}. A link there is never "
            "followed and the folder must be this user's: remove the link, or choose another --out"
        ) from exc


def _next_version(folder: Path) -> Path:
    taken = [int(p.stem.removeprefix("instructions-v")) for p in folder.glob("instructions-v*.md")
             if p.stem.removeprefix("instructions-v").isdigit()]  # fmt: skip
    return folder / f"instructions-v{max(taken, default=0) + 1}.md"


async def optimize(
    runner: TurnRunner,
    dataset: Path,
    *,
    out: Path | None = None,
    holdout: float = 0.3,
    budget: int = 20,
    reflection_model: str | None = None,
    judge_model: str | None = None,
    seed: int = 0,
    concurrency: int = 1,
    progress: Progress | None = None,
) -> OptimizeOutcome:
    """Evolve the instructions with GEPA on the training tasks (at most ``budget`` task runs), then keep the
    candidate only if it beats the baseline on the held-out tasks.

    Raises:
        ValidationError: a bad data set, fewer than 2 tasks, or a bad holdout or budget.
        LMError: no reflection (or judge) model can be built.
        ConfigError: the output folder or its ``history.jsonl`` is a link or not this user's.
    """
    if not 1 <= budget <= 10_000:
        raise ValidationError("--budget is the number of task runs GEPA may spend, from 1 to 10000")
    tasks = await asyncio.to_thread(load_dataset, dataset)
    train, held = split(tasks, holdout, seed)
    judge = (
        await asyncio.to_thread(model_judge, runner.settings, judge_model)
        if any(t.scorer == "judge" for t in tasks)
        else None
    )
    reflect: Any = await asyncio.to_thread(_reflection, runner.settings, reflection_model)
    folder, history = await asyncio.to_thread(_open_history, runner.settings.home, out)  # before any task runs
    try:
        outcome = await _search(runner, dataset.stem, folder, train, held, judge, reflect, budget, seed,
                                concurrency, progress)  # fmt: skip
        record = {**asdict(outcome), "instructions": str(outcome.instructions) if outcome.instructions else None}
        record["dataset"] = str(dataset)
        record["at"] = datetime.now(UTC).isoformat(timespec="seconds")
        os.write(history, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    finally:
        os.close(history)
    return outcome


async def _search(
    runner: TurnRunner,
    name: str,
    folder: Path,
    train: list[EvalTask],
    held: list[EvalTask],
    judge: Judge | None,
    reflect: Any,
    budget: int,
    seed: int,
    concurrency: int,
    progress: Progress | None,
) -> OptimizeOutcome:
    """GEPA's search on ``train``, both texts scored on ``held``, and the candidate written when it is better."""
    import gepa  # noqa: PLC0415 - gepa only while optimizing

    from fleet_kernel.engine.turn import base_instructions  # noqa: PLC0415 - engine.turn imports dspy

    candidates = _Candidates(runner, folder, judge, f"optimize {name}", concurrency)
    loop = asyncio.get_running_loop()

    def run(text: str, batch: Sequence[EvalTask]) -> list[RunResult]:
        return asyncio.run_coroutine_threadsafe(candidates.score(text, batch, progress), loop).result()

    baseline_text = base_instructions(runner.settings)
    adapter: Any = _FleetAdapter(run)

    def search() -> Any:
        return gepa.optimize(
            seed_candidate={COMPONENT: baseline_text},
            trainset=train,
            valset=train,
            adapter=adapter,
            reflection_lm=reflect,
            max_metric_calls=budget,
            seed=seed,
        )

    try:
        result = await asyncio.to_thread(search)
        best = result.best_candidate
        candidate_text = best[COMPONENT] if isinstance(best, dict) else str(best)
        baseline = statistics.fmean(r.score for r in await candidates.score(baseline_text, held, progress))
        if candidate_text.strip() == baseline_text.strip():
            candidate = baseline
        else:
            candidate = statistics.fmean(r.score for r in await candidates.score(candidate_text, held, progress))
    finally:
        await candidates.close()
    adopted = candidate > baseline
    path = _next_version(folder) if adopted else None
    if path is not None:  # a link at that name is replaced, never written through
        safe_files.write_path(folder, path.name, (candidate_text.strip() + "\n").encode("utf-8"))
    return OptimizeOutcome(
        baseline, candidate, adopted, path, [t.task_id for t in train], [t.task_id for t in held], candidate_text
    )
