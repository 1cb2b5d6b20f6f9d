"""``GET /api/sessions/{id}/notebook``: the session as an nbformat 4 notebook that opens in JupyterLab."""

from __future__ import annotations

from fastapi import APIRouter, Response

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_kernel.transcript import notebook_filename
from fleet_kernel.transcript import session_notebook as build_notebook

router = APIRouter(tags=["sessions"])

NOTEBOOK_MIME = "application/x-ipynb+json"


@router.get(
    "/sessions/{session_id}/notebook",
    response_class=Response,
    responses={200: {"description": "an nbformat 4 notebook", "content": {NOTEBOOK_MIME: {}}}, **errors(404)},
)
async def session_notebook(session_id: str, state: State) -> Response:
    import nbformat  # slow to import; only this route needs it

    session = await state.store.get_session(check_id(session_id, "session"))
    notebook = await build_notebook(state.store, session_id)
    name = notebook_filename(session)  # an ASCII slug: no quoting needed
    return Response(
        nbformat.writes(notebook),
        media_type=NOTEBOOK_MIME,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
