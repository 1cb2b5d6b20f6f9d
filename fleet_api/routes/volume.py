"""``GET /api/volume/tree``: a bounded, read-only listing of one session's workspace."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import VolumeEntry, VolumeTree
from fleet_api.volume import MAX_DEPTH, MAX_ENTRIES, list_tree

router = APIRouter(tags=["workspace"])


@router.get("/volume/tree", response_model=VolumeTree, responses=errors(404))
async def volume_tree(
    state: State,
    session_id: str = Query(..., description="whose workspace"),
    path: str = Query("", max_length=1024, description="folder to list, relative to the workspace root"),
    depth: int = Query(3, ge=1, le=MAX_DEPTH, description="levels below the folder"),
    limit: int = Query(500, ge=1, le=MAX_ENTRIES, description="most entries returned"),
) -> VolumeTree:
    await state.sessions.get(check_id(session_id, "session"))
    root = state.settings.workspaces_dir / session_id
    listed, entries, truncated = await asyncio.to_thread(list_tree, root, path, max_depth=depth, limit=limit)
    return VolumeTree(
        session_id=session_id,
        path=listed,
        max_depth=depth,
        entries=[VolumeEntry.model_validate(e) for e in entries],
        truncated=truncated,
    )
