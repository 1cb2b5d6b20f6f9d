"""``GET /api/health``: liveness, version, and whether the store and the sandbox can serve turns.

A store that answers reads but cannot take writes (a full disk, a read-only or deleted file) cannot
run a turn: it is reported as such, with status 503, from a tiny write probe (at most once a second,
see ``FleetState.store_problem``) and from the last error of this process's event writer.

Anyone who can reach the server may call it, token or not, so it names files by their last
component only: no absolute path of this machine appears in it.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Response

from fleet_api.deps import State
from fleet_api.schemas import ComponentHealth, Health
from fleet_kernel import __version__

router = APIRouter(tags=["health"])

# An absolute path (not the path of a URL such as postgresql://host/db): kept to its last component.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/(?:[^\s/'\"(),;]+/)*([^\s/'\"(),;]+)")


def without_paths(detail: str) -> str:
    """``detail`` with each absolute path cut to its file or folder name."""
    return _ABSOLUTE_PATH.sub(r"\1", detail)


@router.get(
    "/health",
    response_model=Health,
    summary="Liveness and component status (no token needed)",
    responses={503: {"model": Health, "description": "The store cannot be read or written; `store.detail` says why"}},
)
async def health(state: State, response: Response) -> Health:
    backend = "sqlite" if state.store.sqlite else state.store.engine.dialect.name
    problem = await state.store_problem()
    await state.refresh_sandbox()
    sandbox_ok, sandbox_detail = state.sandbox_status()
    if problem is not None:
        response.status_code = 503
    return Health(
        status="ok" if problem is None and sandbox_ok else "degraded",
        version=__version__,
        store=ComponentHealth(
            ok=problem is None, detail=backend if problem is None else without_paths(f"{backend}: {problem}")
        ),
        sandbox=ComponentHealth(ok=sandbox_ok, detail=without_paths(sandbox_detail)),
    )
