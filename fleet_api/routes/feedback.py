"""Feedback on a turn's answer: good or bad, with a note; the latest mark is kept. The turns marked good
are a data set (their answers the expected ones) that ``POST /api/evals`` takes as it is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import FEEDBACK_EXAMPLES, Feedback, FeedbackCreate, FeedbackDataset
from fleet_kernel.evals.feedback import good_tasks, mark

router = APIRouter(tags=["feedback"])

MAX_DATASET_TASKS = 200  # as many rows as one POST /api/evals takes


@router.post("/sessions/{session_id}/turns/{turn_id}/feedback", response_model=Feedback, responses=errors(404))
async def put_feedback(
    session_id: str,
    turn_id: str,
    body: Annotated[FeedbackCreate, Body(openapi_examples=FEEDBACK_EXAMPLES)],
    state: State,
) -> Feedback:
    """Mark the turn's answer good or bad (a finished turn; a new mark replaces the earlier one)."""
    row = await mark(state.store, check_id(session_id, "session"), check_id(turn_id, "turn"), body.rating, body.note)
    return Feedback.model_validate(row.to_dict())


@router.get("/sessions/{session_id}/turns/{turn_id}/feedback", response_model=Feedback, responses=errors(404))
async def get_feedback(session_id: str, turn_id: str, state: State) -> Feedback:
    """The turn's feedback; 404 when it has none."""
    row = await state.sessions.feedback(check_id(session_id, "session"), check_id(turn_id, "turn"))
    return Feedback.model_validate(row.to_dict())


@router.get("/feedback/dataset", response_model=FeedbackDataset, responses=errors(404))
async def feedback_dataset(
    state: State,
    session_id: str | None = Query(None, description="only this session's turns (default: every session's)"),
    limit: int = Query(MAX_DATASET_TASKS, ge=1, le=MAX_DATASET_TASKS, description="the latest this many"),
) -> FeedbackDataset:
    """The turns marked good, as data set rows with their answers as the expected ones (oldest first).

    What ``%fleet feedback add`` appends to a JSONL file, for every turn marked good that has an answer;
    404 for an unknown session.
    """
    if session_id is not None:
        await state.sessions.get(check_id(session_id, "session"))
    tasks = await good_tasks(state.store, session_id, limit)
    return FeedbackDataset(tasks=[task.to_row() for task in tasks])
