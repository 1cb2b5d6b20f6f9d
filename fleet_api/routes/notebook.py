"""``GET /api/sessions/{id}/notebook``: the session as an nbformat 4 notebook that opens in JupyterLab."""

from __future__ import annotations

from fastapi import APIRouter, Response

from fleet_api.deps import check_id
from fleet_api.routes._docs import errors
from fleet_api.routes.sessions import SessionsDep

router = APIRouter(tags=["sessions"])

NOTEBOOK_MIME = "application/x-ipynb+json"


@router.get(
    "/sessions/{session_id}/notebook",
    response_class=Response,
    responses={200: {"description": "an nbformat 4 notebook", "content": {NOTEBOOK_MIME: {}}}, **errors(404)},
)
async def session_notebook(session_id: str, sessions: SessionsDep) -> Response:
    export = await sessions.export(check_id(session_id, "session"))
    return Response(
        export.text(),
        media_type=NOTEBOOK_MIME,
        headers={"Content-Disposition": f'attachment; filename="{export.filename}"'},  # an ASCII slug: no quoting
    )
