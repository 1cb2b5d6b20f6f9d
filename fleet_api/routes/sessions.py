"""Session CRUD and committed turn history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import (
    SESSION_CREATE_EXAMPLES,
    SESSION_UPDATE_EXAMPLES,
    HistorySummary,
    HistoryWindow,
    Session,
    SessionConfig,
    SessionCreate,
    SessionHistory,
    SessionList,
    SessionUpdate,
    TurnList,
)
from fleet_api.views import turn_view
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.store.models import iso
from fleet_kernel.store.sessions import MAX_PAGE, Archived

router = APIRouter(tags=["sessions"])


def get_sessions(state: State) -> Sessions:
    return state.sessions


SessionsDep = Annotated[Sessions, Depends(get_sessions)]
"""The engine's sessions service over this process's store and settings."""


@router.post("/sessions", status_code=201, response_model=Session, responses=errors())
async def create_session(
    sessions: SessionsDep,
    body: Annotated[SessionCreate | None, Body(openapi_examples=SESSION_CREATE_EXAMPLES)] = None,
) -> Session:
    row = await sessions.create(body.title if body is not None else "")
    return Session.model_validate(row.to_dict())


@router.get("/sessions", response_model=SessionList, responses=errors())
async def list_sessions(
    sessions: SessionsDep,
    limit: int = Query(200, ge=1, le=MAX_PAGE),
    cursor: str | None = Query(None, description="the next_cursor of the previous page"),
    q: str | None = Query(None, max_length=200, description="words in the title or in a task of its turns"),
    archived: Annotated[Archived, Query(description="false: hide archived sessions; true: only those; all")] = "false",
) -> SessionList:
    """Sessions newest first, a page at a time."""
    page = await sessions.page(limit=limit, cursor=cursor, q=q, archived=archived)
    return SessionList(
        sessions=[Session.model_validate(r.to_dict()) for r in page.sessions], next_cursor=page.next_cursor
    )


@router.get("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def get_session(session_id: str, sessions: SessionsDep) -> Session:
    row = await sessions.get(check_id(session_id, "session"))
    return Session.model_validate(row.to_dict())


@router.patch("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def update_session(
    session_id: str,
    body: Annotated[SessionUpdate, Body(openapi_examples=SESSION_UPDATE_EXAMPLES)],
    sessions: SessionsDep,
) -> Session:
    """Rename, archive or unarchive, and choose the session's models (null: the configured ones)."""
    row = await sessions.update(check_id(session_id, "session"), body.model_dump(exclude_unset=True))
    return Session.model_validate(row.to_dict())


@router.get("/sessions/{session_id}/config", response_model=SessionConfig, responses=errors(404))
async def get_session_config(session_id: str, state: State, sessions: SessionsDep) -> SessionConfig:
    """The settings a turn of this session would run with now (its models, sandbox, limits, history
    window, memory caps), with no secret."""
    config = await sessions.config(check_id(session_id, "session"), await state.runner.sandbox_name())
    return SessionConfig.model_validate(config)


@router.delete(
    "/sessions/{session_id}",
    status_code=204,
    response_class=Response,
    responses=errors(404, 409),
    summary="Delete a session with its turns, events, attachments, artifacts and workspace",
)
async def delete_session(session_id: str, state: State, sessions: SessionsDep) -> Response:
    turn_ids = await sessions.delete(check_id(session_id, "session"))
    state.frames.forget(list(turn_ids))
    return Response(status_code=204)


@router.get("/sessions/{session_id}/turns", response_model=TurnList, responses=errors(404))
async def list_turns(session_id: str, sessions: SessionsDep) -> TurnList:
    rows = await sessions.turns(check_id(session_id, "session"))
    lineage = await sessions.lineage(session_id)
    return TurnList(turns=[turn_view(r, lineage) for r in rows])


@router.get("/sessions/{session_id}/history", response_model=SessionHistory, responses=errors(404))
async def get_history(session_id: str, sessions: SessionsDep) -> SessionHistory:
    """What the next turn sees of earlier turns: the sub-model's summary of those past the window, and the
    latest turns whole (docs/api.md, "Long sessions")."""
    plan = await sessions.history(check_id(session_id, "session"))
    lineage = await sessions.lineage(session_id)
    shown = plan.summary or plan.stale
    summary = None
    if shown is not None:
        summary = HistorySummary(
            text=shown.text,
            turn_ids=list(shown.covers),
            model=shown.model,
            updated_at=iso(shown.updated_at) or "",
            stale=plan.summary is None,
        )
    window = plan.window
    return SessionHistory(
        session_id=session_id,
        seen=len(plan.seen),
        summarised=plan.older,
        pending=max(0, plan.older - plan.covered),
        summary=summary,
        turns=[turn_view(row, lineage) for row in plan.recent],
        window=HistoryWindow(turns=window.turns, chars=window.chars, context_tokens=window.context_tokens),
    )
