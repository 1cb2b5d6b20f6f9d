"""Session CRUD and committed turn history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import Session, SessionCreate, SessionList, SessionUpdate, TurnList
from fleet_api.views import turn_view
from fleet_kernel.engine.sessions import Sessions

router = APIRouter(tags=["sessions"])


def get_sessions(state: State) -> Sessions:
    return Sessions(state.store, state.settings)


SessionsDep = Annotated[Sessions, Depends(get_sessions)]
"""The engine's sessions service over this process's store and settings."""


@router.post("/sessions", status_code=201, response_model=Session, responses=errors())
async def create_session(sessions: SessionsDep, body: SessionCreate | None = None) -> Session:
    row = await sessions.create(body.title if body is not None else "")
    return Session.model_validate(row.to_dict())


@router.get("/sessions", response_model=SessionList, responses=errors())
async def list_sessions(sessions: SessionsDep, limit: int = Query(200, ge=1, le=1000)) -> SessionList:
    rows = await sessions.list(limit=limit)
    return SessionList(sessions=[Session.model_validate(r.to_dict()) for r in rows])


@router.get("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def get_session(session_id: str, sessions: SessionsDep) -> Session:
    row = await sessions.get(check_id(session_id, "session"))
    return Session.model_validate(row.to_dict())


@router.patch("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def update_session(session_id: str, body: SessionUpdate, sessions: SessionsDep) -> Session:
    row = await sessions.rename(check_id(session_id, "session"), body.title)
    return Session.model_validate(row.to_dict())


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
async def list_turns(session_id: str, state: State) -> TurnList:
    rows = await state.store.list_turns(check_id(session_id, "session"))
    lineage = await state.store.lineage(session_id)
    return TurnList(turns=[turn_view(r, lineage) for r in rows])
