"""``PUT /api/runs/{run_id}/cancellation``: a durable request, honoured wherever the turn runs."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from fleet_api.deps import State, check_id
from fleet_api.routes._docs import errors
from fleet_api.schemas import Cancellation

router = APIRouter(tags=["turns"])

REASON = "cancelled over HTTP (PUT /api/runs/{run_id}/cancellation)"


@router.put(
    "/runs/{run_id}/cancellation",
    status_code=202,
    response_model=Cancellation,
    responses=errors(404),
    summary="Cancel a running turn, in this process or any other sharing the store",
)
async def cancel_run(run_id: str, state: State) -> JSONResponse:
    row, outcome = await state.sessions.request_cancel(check_id(run_id, "run", code="run_not_found"), REASON)
    # The store record reaches the owning process within a heartbeat; when that is us, act at once.
    if outcome == "requested":
        state.runner.cancel(row.turn_id, REASON)
    body = Cancellation(run_id=row.run_id, state=outcome, turn_id=row.turn_id)
    return JSONResponse(body.model_dump(), status_code=202)
