"""A session's workspace files over HTTP (the logic is ``fleet_kernel.engine.workspace_files``)."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._content import FileStream
from fleet_api.routes._docs import errors
from fleet_api.schemas import WorkspaceStat
from fleet_kernel.engine.workspace_files import WorkspaceFiles
from fleet_kernel.workspace import guess_mime

router = APIRouter(tags=["workspace"])

# Raw-bytes bodies (application/octet-stream) as large as storage.max_upload_mb: see origin.py and limits.py.
RAW_PATHS = re.compile(r"^/api/sessions/[^/]+/workspace/files/")


def _files(state: State, session_id: str) -> WorkspaceFiles:
    return WorkspaceFiles(state.store, state.settings, check_id(session_id, "session"))


@router.get(
    "/sessions/{session_id}/workspace/files/{path:path}",
    response_class=Response,
    responses={200: {"description": "the file's bytes"}, **errors(404)},
)
async def get_workspace_file(session_id: str, path: str, state: State) -> Response:
    rel, opened = await _files(state, session_id).open(path)
    response = FileStream(opened, mime=guess_mime(rel), filename=rel.rsplit("/", 1)[-1])
    response.headers["Cache-Control"] = "private, no-cache"  # a workspace file changes; its ETag says when
    return response


@router.put(
    "/sessions/{session_id}/workspace/files/{path:path}",
    response_model=WorkspaceStat,
    responses=errors(404, 409, 413, 507),
    summary="Create or replace a workspace file; the body is its bytes (Content-Type: application/octet-stream)",
)
async def put_workspace_file(session_id: str, path: str, request: Request, state: State) -> WorkspaceStat:
    found = await _files(state, session_id).write(path, await request.body())
    return WorkspaceStat(path=found.path, size=found.size, sha256=found.sha256, modified_at=found.modified_at)


@router.delete(
    "/sessions/{session_id}/workspace/files/{path:path}",
    status_code=204,
    response_class=Response,
    responses=errors(404, 409),
)
async def delete_workspace_file(session_id: str, path: str, state: State) -> Response:
    await _files(state, session_id).delete(path)
    return Response(status_code=204)


@router.get("/sessions/{session_id}/workspace/stat/{path:path}", response_model=WorkspaceStat, responses=errors(404))
async def stat_workspace_file(session_id: str, path: str, state: State) -> WorkspaceStat:
    found = await _files(state, session_id).stat(path)
    return WorkspaceStat(path=found.path, size=found.size, sha256=found.sha256, modified_at=found.modified_at)
