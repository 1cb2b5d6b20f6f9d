"""Committed artifacts: metadata, and the bytes served with their own content type."""

from __future__ import annotations

from fastapi import APIRouter, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._content import content_response
from fleet_api.routes._docs import errors
from fleet_api.schemas import Artifact

router = APIRouter(tags=["artifacts"])


@router.get("/artifacts/{artifact_id}", response_model=Artifact, responses=errors(404))
async def get_artifact(artifact_id: str, state: State) -> Artifact:
    row = await state.sessions.artifact(check_id(artifact_id, "artifact"))
    return Artifact.model_validate(row.to_dict())


@router.get(
    "/artifacts/{artifact_id}/content",
    response_class=Response,
    responses={200: {"description": "the artifact's bytes, with its content type"}, **errors(404)},
)
async def get_artifact_content(artifact_id: str, state: State) -> Response:
    row = await state.sessions.artifact(check_id(artifact_id, "artifact"))
    data = await state.sessions.content(row)
    return content_response(data, mime=row.mime, filename=row.path.rsplit("/", 1)[-1], sha256=row.sha256)
