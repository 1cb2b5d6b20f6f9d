"""Feedback on answers, and marked turns as data set rows: what ``%fleet feedback`` and the API share."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet_kernel.errors import NotFoundError, ValidationError
from fleet_kernel.evals.dataset import EvalTask, append_row
from fleet_kernel.store import FeedbackRow, Store


async def mark(store: Store, session_id: str, turn_id: str, rating: str, note: str = "") -> FeedbackRow:
    """Mark a finished turn's answer good or bad (see ``Store.put_feedback``)."""
    return await store.put_feedback(session_id, turn_id, rating, note)


async def as_task(store: Store, session_id: str, turn_id: str) -> EvalTask:
    """A turn marked good as a task whose expected answer is the one it gave (scored ``exact``).

    Raises:
        NotFoundError: no such turn, or it has no feedback.
        ValidationError: the turn is marked bad (its answer is not one to expect) or has no answer.
    """
    feedback = await store.get_feedback(session_id, turn_id)
    if feedback.rating != "good":
        raise ValidationError(f"turn {turn_id} is marked bad: only an answer marked good can be the expected one")
    turn = await store.get_turn(turn_id, session_id)
    if not turn.answer:
        raise ValidationError(f"turn {turn_id} has no answer to expect")
    return EvalTask(task_id=turn_id, task=turn.task, scorer="exact", expected=turn.answer)


async def add_to_dataset(store: Store, session_id: str, turn_id: str, dataset: Path) -> EvalTask:
    """Append the turn (marked good) to a JSONL data set as a task with its answer as expected."""
    task = await as_task(store, session_id, turn_id)
    await asyncio.to_thread(append_row, dataset, task)
    return task


async def good_tasks(store: Store, session_id: str | None = None, limit: int = 200) -> list[EvalTask]:
    """The ``limit`` turns most recently marked good (first marked: a new mark keeps its place), of one
    session or all, oldest first, as ``as_task`` makes them: a data set of what users approved, for
    ``POST /api/evals`` or a JSONL file.

    A turn without an answer is left out, as is one whose mark or session changed while this reads.
    """
    tasks: list[EvalTask] = []
    for row in reversed(await store.list_feedback(session_id, rating="good")):
        if len(tasks) == limit:
            break
        try:
            tasks.append(await as_task(store, row.session_id, row.turn_id))
        except (NotFoundError, ValidationError):
            continue
    return tasks[::-1]
