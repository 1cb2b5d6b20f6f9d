"""Feedback on a turn's answer: good or bad, with a note; the latest mark is kept."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import FEEDBACK_EXAMPLES, Feedback, FeedbackCreate
from fleet_kernel.evals.feedback import mark

router = APIRouter(tags=["feedback"])


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
    row = await state.store.get_feedback(check_id(session_id, "session"), check_id(turn_id, "turn"))
    return Feedback.model_validate(row.to_dict())
