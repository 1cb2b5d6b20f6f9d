"""Session CRUD and committed turn history."""

from __future__ import annotations

import asyncio
import logging
import shutil

from fastapi import APIRouter, Query, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import Session, SessionConfig, SessionCreate, SessionList, SessionUpdate, TurnList
from fleet_api.views import turn_view
from fleet_kernel import sandbox
from fleet_kernel.config import Settings
from fleet_kernel.engine.session_config import effective_config
from fleet_kernel.errors import ValidationError
from fleet_kernel.store.sessions import MAX_PAGE, Archived

log = logging.getLogger("fleet_api")
router = APIRouter(tags=["sessions"])


@router.post("/sessions", status_code=201, response_model=Session, responses=errors())
async def create_session(state: State, body: SessionCreate | None = None) -> Session:
    row = await state.store.create_session(body.title if body is not None else "")
    return Session.model_validate(row.to_dict())


@router.get("/sessions", response_model=SessionList, responses=errors())
async def list_sessions(
    state: State,
    limit: int = Query(200, ge=1, le=MAX_PAGE),
    cursor: str | None = Query(None, description="the next_cursor of the previous page"),
    q: str | None = Query(None, max_length=200, description="words in the title or in a task of its turns"),
    archived: Archived = Query("false", description="false: hide archived sessions; true: only those; all"),
) -> SessionList:
    """Sessions newest first, a page at a time."""
    page = await state.store.page_sessions(limit=limit, cursor=cursor, q=q, archived=archived)
    return SessionList(sessions=[Session.model_validate(r.to_dict()) for r in page.sessions],
                       next_cursor=page.next_cursor)


@router.get("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def get_session(session_id: str, state: State) -> Session:
    row = await state.store.get_session(check_id(session_id, "session"))
    return Session.model_validate(row.to_dict())


@router.patch("/sessions/{session_id}", response_model=Session, responses=errors(404))
async def update_session(session_id: str, body: SessionUpdate, state: State) -> Session:
    """Rename, archive or unarchive, and choose the session's models (null: the configured ones)."""
    fields = body.model_dump(exclude_unset=True)
    if not fields:
        raise ValidationError("nothing to change: send title, archived, model or sub_model")
    for key in ("title", "archived"):
        if key in fields and fields[key] is None:
            raise ValidationError(f"{key} cannot be null")
    row = await state.store.update_session(check_id(session_id, "session"), **fields)
    return Session.model_validate(row.to_dict())


@router.get("/sessions/{session_id}/config", response_model=SessionConfig, responses=errors(404))
async def get_session_config(session_id: str, state: State) -> SessionConfig:
    """The settings a turn of this session would run with now (its models, sandbox, limits, history
    window, memory caps), with no secret."""
    row = await state.store.get_session(check_id(session_id, "session"))
    return SessionConfig.model_validate(effective_config(state.runner.settings, row, state.runner.sandbox_name()))


@router.delete(
    "/sessions/{session_id}",
    status_code=204,
    response_class=Response,
    responses=errors(404, 409),
    summary="Delete a session with its turns, events, attachments, artifacts and workspace",
)
async def delete_session(session_id: str, state: State) -> Response:
    turns = await state.store.list_turns(check_id(session_id, "session"))
    await state.store.delete_session(session_id)
    state.frames.forget([t.turn_id for t in turns])
    workspace = state.settings.workspaces_dir / session_id
    await asyncio.to_thread(shutil.rmtree, workspace, ignore_errors=True)
    await _forget_sandbox(state.settings, session_id)
    return Response(status_code=204)


async def _forget_sandbox(settings: Settings, session_id: str) -> None:
    """The backend drops what it keeps for the session (Daytona: its warm sandbox, which also auto-deletes)."""
    try:
        await asyncio.to_thread(sandbox.forget, settings, session_id)
    except Exception as exc:  # noqa: BLE001 - the session is deleted already; say so rather than fail
        log.warning(
            "could not delete the sandbox of session %s (Daytona deletes it after it stops): %s",
            session_id,
            getattr(exc, "message", exc),
        )


@router.get("/sessions/{session_id}/turns", response_model=TurnList, responses=errors(404))
async def list_turns(session_id: str, state: State) -> TurnList:
    rows = await state.store.list_turns(check_id(session_id, "session"))
    return TurnList(turns=[turn_view(r) for r in rows])
